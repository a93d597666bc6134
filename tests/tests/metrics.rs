//! End-to-end test of `[metrics] listen`: two MSRs serve Prometheus text and the status
//! page on their fixed-LAN addresses while a transfer moves between them. The scraped
//! text must pass `promtool check metrics` (Debian's prometheus package) and show the
//! handoff; the endpoint must not answer on the cell gateway address; headless
//! Chromium (Debian's chromium) loads the status page from the GW and must show the
//! handoff. A second test draws rolled-back and moved handoffs and measures the page's
//! labels in the DOM (no overlap, no "resumed" for a rollback, repeats counted), then
//! upgrades msrd in place and checks that the histogram and the recent handoffs stay.
//! Screenshots of the page are kept under target/tmp. Needs root, promtool and
//! chromium (scripts/setup.sh installs them; chromium runs with --no-sandbox as root);
//! never skipped.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use itcp_handoff::log::{Outcome, Record, Role};
use itcp_testbed::lab::{self, addr, bin_path, Host, Lab, LabConfig};
use itcp_testbed::sys;
use itcp_testbed::ttcp::{RecvReport, SendReport};
use serde::Deserialize;

const PORT: u16 = 9473;

fn metrics_addr(k: usize) -> SocketAddr {
    SocketAddr::from((addr::msr_lan(k), PORT))
}

/// One HTTP/1.1 request from inside namespace `ns`: (status, body).
fn http(ns: &str, to: SocketAddr, method: &str, path: &str) -> io::Result<(u16, String)> {
    sys::in_netns(ns, || {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(s, "{method} {path} HTTP/1.1\r\nHost: {to}\r\n\r\n")?;
        let mut out = Vec::new();
        s.read_to_end(&mut out)?;
        let out = String::from_utf8_lossy(&out).into_owned();
        let (head, body) = out
            .split_once("\r\n\r\n")
            .ok_or_else(|| io::Error::other(format!("no HTTP head in {out:?}")))?;
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| io::Error::other(format!("no status in {head:?}")))?;
        Ok((status, body.to_string()))
    })
}

fn scrape(lab: &Lab, k: usize) -> String {
    let (status, body) = http(&lab.ns(Host::Gw), metrics_addr(k), "GET", "/metrics")
        .unwrap_or_else(|e| panic!("scraping MSR{k}: {e}"));
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the sample written exactly as `series` (name and labels).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn promtool_check(text: &str, dir: &Path, name: &str) {
    let file = dir.join(name);
    std::fs::write(&file, text).unwrap();
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool: {e} (install Debian's prometheus package: scripts/setup.sh)")
        });
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics on {name}: {}\n{said}\n{text}",
        out.status
    );
    eprintln!("promtool check metrics: {name} ok");
}

/// Runs headless Chromium in the GW's namespace; returns its stdout.
fn chromium(lab: &mut Lab, profile: &Path, args: &[&str]) -> String {
    let _ = std::fs::remove_dir_all(profile);
    std::fs::create_dir_all(profile).unwrap();
    let user_data = format!("--user-data-dir={}", profile.display());
    let mut all = vec![
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        &user_data,
    ];
    all.extend_from_slice(args);
    let idx = lab
        .spawn(Host::Gw, "chromium", &all)
        .unwrap_or_else(|e| panic!("chromium: {e} (install Debian's chromium: scripts/setup.sh)"));
    let (_, out, err) = lab.wait(idx, Duration::from_secs(90)).unwrap();
    if out.trim().is_empty() && !args.iter().any(|a| a.starts_with("--screenshot")) {
        eprintln!("chromium printed nothing; stderr:\n{err}");
    }
    out
}

#[derive(Deserialize)]
struct StatusDoc {
    msr: String,
    handoffs: Vec<Record>,
}

#[test]
fn metrics_and_status_page_follow_a_handoff() {
    let mut lab = Lab::new(LabConfig::clean(2, 131)).unwrap();
    let (msrds, _) = lab
        .start_itcp_mobility(
            &format!("[metrics]\nlisten = \"{{MSR_LAN}}:{PORT}\"\n"),
            &["--hysteresis-ms", "0"],
        )
        .unwrap();
    let gw = lab.ns(Host::Gw);

    // Nothing yet: the families are there, every value 0, and promtool is content.
    let before = scrape(&lab, 2);
    promtool_check(&before, &lab.dir, "msr2-idle.prom");
    assert_eq!(
        sample(&before, "msrd_handoffs_total{direction=\"in\"}"),
        Some(0.0)
    );

    // Only the configured address answers: not the cell gateway address (from the
    // MSR itself and from the MH), not another port.
    for (h, to) in [
        (Host::Msr(1), SocketAddr::from((addr::CELL_GW, PORT))),
        (Host::Mh, SocketAddr::from((addr::CELL_GW, PORT))),
        (Host::Gw, SocketAddr::from((addr::msr_lan(1), PORT + 1))),
    ] {
        let r = http(&lab.ns(h), to, "GET", "/metrics");
        assert!(r.is_err(), "{to} answered from {h:?}: {r:?}");
        eprintln!("{to} from {h:?}: {}", r.unwrap_err());
    }
    assert_eq!(http(&gw, metrics_addr(1), "GET", "/nope").unwrap().0, 404);
    assert_eq!(
        http(&gw, metrics_addr(1), "POST", "/metrics").unwrap().0,
        405
    );

    // A download through I-TCP, long enough to still run when the page is loaded.
    let bytes: u64 = 64 << 20;
    let n = bytes.to_string();
    let fh = lab::fh_addr(5001);
    let ttcp = bin_path("ttcp");
    let send = lab
        .spawn(Host::Fh, &ttcp, &["send", "--listen", &fh, "--bytes", &n])
        .unwrap();
    lab.wait_listening(Host::Fh, 5001).unwrap();
    let recv = lab
        .spawn(
            Host::Mh,
            &ttcp,
            &["recv", "--connect", &fh, "--bytes", &n, "--itcp"],
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let m1 = scrape(&lab, 1);
    assert_eq!(
        sample(&m1, "msrd_connections{kind=\"connect\",state=\"relaying\"}"),
        Some(1.0),
        "{m1}"
    );
    assert_eq!(sample(&m1, "msrd_mhs"), Some(1.0));
    assert!(sample(&m1, "msrd_bytes_total{direction=\"down\"}").unwrap() > 0.0);

    // Scrape both MSRs continuously across the handoff: every scrape must succeed.
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = std::thread::spawn({
        let (stop, gw) = (stop.clone(), gw.clone());
        move || {
            let (mut ok, mut failed) = (0, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                for k in 1..=2 {
                    match http(&gw, metrics_addr(k), "GET", "/metrics") {
                        Ok((200, b)) if b.contains("msrd_handoff_duration_seconds_count") => {
                            ok += 1
                        }
                        other => failed.push(format!("MSR{k}: {other:?}")),
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (ok, failed)
        }
    });
    lab.assoc(&[1, 2]).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    lab.assoc(&[2]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let id = loop {
        if let Some(r) = lab
            .handoff_records(2)
            .into_iter()
            .find(|r| r.role == Role::New)
        {
            break r;
        }
        assert!(Instant::now() < deadline, "MSR2 logged no handoff");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(id.outcome, Outcome::Moved, "{id:?}");
    let id = id.handoff_id;
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = scraper.join().unwrap();
    assert!(
        failed.is_empty(),
        "scrapes failed during the handoff: {failed:?}"
    );
    assert!(ok >= 10, "only {ok} scrapes during the handoff");
    eprintln!("{ok} scrapes during the handoff, none failed");

    // The new MSR counts the handoff in, its duration and the moved connection, and
    // relays the connection now.
    let m2 = scrape(&lab, 2);
    promtool_check(&m2, &lab.dir, "msr2-after.prom");
    for (series, want) in [
        ("msrd_handoffs_total{direction=\"in\"}", 1.0),
        ("msrd_handoff_duration_seconds_count{role=\"new\"}", 1.0),
        (
            "msrd_handoff_duration_seconds_bucket{role=\"new\",le=\"+Inf\"}",
            1.0,
        ),
        ("msrd_connections_moved_total{direction=\"in\"}", 1.0),
        ("msrd_connections{kind=\"connect\",state=\"relaying\"}", 1.0),
        ("msrd_mhs", 1.0),
        ("msrd_handoffs_failed_total", 0.0),
    ] {
        assert_eq!(sample(&m2, series), Some(want), "{series}\n{m2}");
    }
    let secs = sample(&m2, "msrd_handoff_duration_seconds_sum{role=\"new\"}").unwrap();
    assert!(secs > 0.0 && secs < 10.0, "handoff took {secs} s?");
    eprintln!(
        "MSR2: handoff in, greeting → resumed {:.1} ms",
        secs * 1000.0
    );
    // The old MSR counts it out (its record is written once the new MSR acknowledged).
    let deadline = Instant::now() + Duration::from_secs(10);
    let m1 = loop {
        let m1 = scrape(&lab, 1);
        if sample(&m1, "msrd_handoff_duration_seconds_count{role=\"old\"}") == Some(1.0) {
            break m1;
        }
        assert!(
            Instant::now() < deadline,
            "MSR1 did not count the handoff\n{m1}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    promtool_check(&m1, &lab.dir, "msr1-after.prom");
    for (series, want) in [
        ("msrd_handoffs_total{direction=\"out\"}", 1.0),
        ("msrd_connections_moved_total{direction=\"out\"}", 1.0),
        ("msrd_connections_active", 0.0),
    ] {
        assert_eq!(sample(&m1, series), Some(want), "{series}\n{m1}");
    }

    // /status.json carries the record.
    let (st, body) = http(&gw, metrics_addr(2), "GET", "/status.json").unwrap();
    assert_eq!(st, 200);
    let doc: StatusDoc = serde_json::from_str(&body).unwrap();
    assert_eq!(doc.msr, "msr2");
    assert!(doc.handoffs.iter().any(|r| r.handoff_id == id), "{body}");

    // The status page, loaded by headless Chromium from the GW, shows the handoff
    // (drawn by the page's script into the DOM) while the transfer still runs.
    let url = format!("http://{}/", metrics_addr(2));
    let profile = lab.dir.join("chromium-profile");
    let needle = format!("data-handoff-id=\"{id}\"");
    let deadline = Instant::now() + Duration::from_secs(120);
    let dom = loop {
        let dom = chromium(
            &mut lab,
            &profile,
            &["--virtual-time-budget=3000", "--dump-dom", &url],
        );
        if dom.contains(&needle) {
            break dom;
        }
        assert!(
            Instant::now() < deadline,
            "the status page never showed handoff {id}; last DOM:\n{dom}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(dom.contains(&format!("handoff #{id}")), "{dom}");
    assert!(dom.contains("msr1 → msr2"), "{dom}");
    assert!(dom.contains("<svg class=\"timeline\""), "{dom}");
    // The page polls /status.json (drawn first from the status embedded in it).
    assert!(
        dom.contains("data-polls=\""),
        "the page never polled:\n{dom}"
    );
    eprintln!(
        "status page shows handoff {id}; MH row present: {}",
        dom.contains("data-mh=\"10.2.0.100\"")
    );
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join("metrics-status-page.png");
    let _ = std::fs::remove_file(&shot);
    chromium(
        &mut lab,
        &profile,
        &[
            "--virtual-time-budget=3000",
            "--window-size=1200,900",
            &format!("--screenshot={}", shot.display()),
            &url,
        ],
    );
    let png =
        std::fs::read(&shot).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", shot.display()));
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    eprintln!("status page screenshot: {}", shot.display());

    // The transfer itself is intact.
    let (_, rout, rerr) = lab.wait(recv, Duration::from_secs(120)).unwrap();
    let (_, sout, serr) = lab.wait(send, Duration::from_secs(30)).unwrap();
    let r: RecvReport =
        serde_json::from_str(rout.trim()).unwrap_or_else(|e| panic!("receiver: {e}: {rerr}"));
    let s: SendReport =
        serde_json::from_str(sout.trim()).unwrap_or_else(|e| panic!("sender: {e}: {serr}"));
    assert!(r.ok && s.ok && r.verified, "{:?} {:?}", r.error, s.error);
    assert_eq!(r.bytes, bytes);
    // Bytes of the whole transfer are counted, across both MSRs.
    let down: f64 = (1..=2)
        .map(|k| sample(&scrape(&lab, k), "msrd_bytes_total{direction=\"down\"}").unwrap())
        .sum();
    assert!(down >= bytes as f64, "{down} < {bytes}");

    // Out of file descriptors, the listener backs off and serves again afterwards.
    let pid = lab.pid(msrds[0]);
    let (open, (soft, hard)) = fds_of(pid);
    // Only the soft limit moves: raising a hard limit back needs CAP_SYS_RESOURCE.
    let set_limit = |n: usize| {
        let ok = Command::new("prlimit")
            .args(["--pid", &pid.to_string(), &format!("--nofile={n}:{hard}")])
            .status()
            .unwrap();
        assert!(ok.success(), "prlimit --nofile={n}:{hard}");
    };
    set_limit(open + 2);
    let idle: Vec<TcpStream> = sys::in_netns(&gw, || {
        (0..8)
            .map(|_| TcpStream::connect_timeout(&metrics_addr(1), Duration::from_secs(5)))
            .collect()
    })
    .unwrap();
    let log = lab.dir.join("msrd1.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("metrics listener: accept failed")
    {
        assert!(Instant::now() < deadline, "msrd never ran out of fds");
        std::thread::sleep(Duration::from_millis(50));
    }
    set_limit(soft);
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match http(&gw, metrics_addr(1), "GET", "/metrics") {
            Ok((200, b)) if b.contains("msrd_connections_active 0") => break,
            other => assert!(
                Instant::now() < deadline,
                "no answer after EMFILE: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "MSR1's metrics listener survived EMFILE (limit {} fds)",
        open + 2
    );
}

/// Open fds and the (soft, hard) fd limits of a process.
fn fds_of(pid: u32) -> (usize, (usize, usize)) {
    let n = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let v: Vec<usize> = line
        .split_whitespace()
        .skip(3)
        .take(2)
        .map(|v| v.parse().unwrap())
        .collect();
    (n, (v[0], v[1]))
}

/// Injected into a copy of the status page: once the page has drawn, measures every
/// timeline label (`getBoundingClientRect`) and writes what it found into the DOM as
/// JSON: overlapping pairs, each handoff entry's outcome, repeat count and labels, and
/// the MH rows' state.
const LAYOUT_CHECK: &str = r#"<script>
window.addEventListener("load", () => setTimeout(() => {
  const res = { overlaps: [], handoffs: [], mh_states: [] };
  for (const h of document.querySelectorAll(".handoff")) {
    const ls = [...h.querySelectorAll(".tl-label, svg.timeline text")]
      .map(l => ({ t: l.textContent, r: l.getBoundingClientRect() }));
    for (let i = 0; i < ls.length; i++) for (let j = i + 1; j < ls.length; j++) {
      const a = ls[i].r, b = ls[j].r;
      if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom)
        res.overlaps.push([h.id, ls[i].t, ls[j].t]);
    }
    const c = h.querySelector("[data-count]");
    res.handoffs.push({ id: h.id, outcome: h.dataset.outcome || "", count: c ? Number(c.dataset.count) : 1,
      labels: ls.map(l => l.t) });
  }
  for (const r of document.querySelectorAll("tr.mh")) res.mh_states.push(r.children[3].textContent);
  const pre = document.createElement("pre");
  pre.id = "layout-check";
  pre.textContent = JSON.stringify(res);
  document.body.append(pre);
}, 300));
</script>
</body>"#;

#[derive(Debug, Deserialize)]
struct LayoutCheck {
    overlaps: Vec<Vec<String>>,
    handoffs: Vec<DrawnHandoff>,
    mh_states: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct DrawnHandoff {
    id: String,
    outcome: String,
    count: usize,
    labels: Vec<String>,
}

/// The status page of MSR `k` as served now, measured in headless Chromium from a
/// copy with [`LAYOUT_CHECK`] in it (loaded from a file: the copy draws the status
/// embedded in it, as the page does before its first poll).
fn layout_of_status_page(lab: &mut Lab, k: usize) -> LayoutCheck {
    let (st, page) = http(&lab.ns(Host::Gw), metrics_addr(k), "GET", "/").unwrap();
    assert_eq!(st, 200);
    assert!(page.contains("</body>"));
    let copy = lab.dir.join(format!("status-msr{k}-checked.html"));
    std::fs::write(&copy, page.replace("</body>", LAYOUT_CHECK)).unwrap();
    let profile = lab.dir.join("chromium-layout");
    let url = format!("file://{}", copy.display());
    let dom = chromium(
        lab,
        &profile,
        &[
            "--virtual-time-budget=2000",
            "--window-size=1200,900",
            "--dump-dom",
            &url,
        ],
    );
    let json = dom
        .split_once("<pre id=\"layout-check\">")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        .map(|(j, _)| {
            j.replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&amp;", "&")
        })
        .unwrap_or_else(|| panic!("the layout check did not run; DOM:\n{dom}"));
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

/// The status page after handoffs that were rolled back (again and again: the new
/// MSR cannot restart the MH's connection) and one that moved: no two phase labels
/// overlap, a rolled-back handoff shows where it was given up instead of "resumed" and
/// "acked", its repeats are one entry with a count, every MH row has a state. Then an
/// in-place upgrade keeps the duration histogram and the recent handoffs.
#[test]
fn status_page_draws_rolled_back_and_moved_handoffs_legibly_and_keeps_them_across_an_upgrade() {
    let mut lab = Lab::new(LabConfig::clean(2, 137)).unwrap();
    lab.start_itcp_mobility_env(
        &format!("[metrics]\nlisten = \"{{MSR_LAN}}:{PORT}\"\n"),
        &["--hysteresis-ms", "0"],
        &[(2, "MSRD_FAULT", "fail_restart:5002")],
    )
    .unwrap();
    let ttcp = bin_path("ttcp");

    // A connection MSR2 cannot take: each handoff to it is rolled back.
    lab.start_fh_echo(5002).unwrap();
    let rr = lab
        .spawn(
            Host::Mh,
            &ttcp,
            &[
                "rr",
                "--connect",
                &lab::fh_addr(5002),
                "--itcp",
                "--count",
                "100000",
                "--interval-ms",
                "50",
            ],
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    lab.assoc(&[2]).unwrap();
    let rolled_back = |lab: &Lab| {
        lab.handoff_records(2)
            .iter()
            .filter(|r| r.outcome == Outcome::RolledBack)
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while rolled_back(&lab) == 0 {
        assert!(Instant::now() < deadline, "MSR2 rolled nothing back");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Whatever retries come meanwhile.
    std::thread::sleep(Duration::from_secs(3));
    lab.terminate(rr);
    lab.assoc(&[1]).unwrap();
    std::thread::sleep(Duration::from_secs(2));

    // A connection that moves (with the first, if it has not ended yet at MSR1: then
    // the handoff is partial).
    let bytes = (32u64 << 20).to_string();
    let fh = lab::fh_addr(5001);
    let send = lab
        .spawn(
            Host::Fh,
            &ttcp,
            &["send", "--listen", &fh, "--bytes", &bytes],
        )
        .unwrap();
    lab.wait_listening(Host::Fh, 5001).unwrap();
    let recv = lab
        .spawn(
            Host::Mh,
            &ttcp,
            &["recv", "--connect", &fh, "--bytes", &bytes, "--itcp"],
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    lab.assoc(&[2]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let moved = loop {
        if let Some(r) = lab.handoff_records(2).into_iter().find(|r| r.went_over()) {
            break r;
        }
        assert!(Instant::now() < deadline, "MSR2 moved nothing");
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_millis(500));
    let records = lab.handoff_records(2);
    let failed = rolled_back(&lab);
    eprintln!(
        "MSR2 logged {} handoffs: {failed} rolled back, then {} moved",
        records.len(),
        moved.handoff_id
    );

    let check = layout_of_status_page(&mut lab, 2);
    eprintln!("{check:#?}");
    assert!(
        check.overlaps.is_empty(),
        "labels overlap: {:?}",
        check.overlaps
    );
    let entry = |outcome: &str| {
        check
            .handoffs
            .iter()
            .find(|h| h.outcome == outcome)
            .unwrap_or_else(|| panic!("no {outcome} handoff drawn: {check:#?}"))
    };
    let m = check
        .handoffs
        .iter()
        .find(|h| h.outcome == "moved" || h.outcome == "partial")
        .unwrap_or_else(|| panic!("no handoff that went over drawn: {check:#?}"));
    assert!(
        m.labels.iter().any(|l| l == "resumed") && m.labels.iter().any(|l| l == "acked"),
        "{m:?}"
    );
    let rb = entry("rolled_back");
    assert!(
        !rb.labels.iter().any(|l| l == "resumed" || l == "acked"),
        "a rolled-back handoff drawn as resumed: {rb:?}"
    );
    assert!(rb.labels.iter().any(|l| l == "rolled back"), "{rb:?}");
    // Repeats are counted, not listed: every record is in one entry.
    let drawn: usize = check.handoffs.iter().map(|h| h.count).sum();
    assert_eq!(drawn, records.len(), "{check:#?}");
    if failed > 1 {
        assert!(
            check.handoffs.len() < records.len(),
            "{failed} rollbacks drawn one by one: {check:#?}"
        );
    }
    assert!(
        !check.mh_states.is_empty() && check.mh_states.iter().all(|s| !s.is_empty()),
        "MH rows without a state: {:?}",
        check.mh_states
    );
    assert!(
        check
            .handoffs
            .iter()
            .any(|h| h.id.starts_with(&format!("handoff-{}", moved.handoff_id))),
        "{check:#?}"
    );

    // A screenshot for people, as a test artefact.
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join("status-page-rolled-back-and-moved.png");
    let _ = std::fs::remove_file(&shot);
    let profile = lab.dir.join("chromium-profile");
    chromium(
        &mut lab,
        &profile,
        &[
            "--virtual-time-budget=3000",
            "--window-size=1200,1000",
            &format!("--screenshot={}", shot.display()),
            &format!("http://{}/", metrics_addr(2)),
        ],
    );
    let png =
        std::fs::read(&shot).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", shot.display()));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{} bytes", png.len());
    eprintln!("status page screenshot: {}", shot.display());

    // An in-place upgrade of MSR2 keeps the histogram and the recent handoffs.
    let before = scrape(&lab, 2);
    let count = "msrd_handoff_duration_seconds_count{role=\"new\"}";
    let n = sample(&before, count).unwrap();
    assert!(n >= 1.0, "{before}");
    let reply = lab.msrd_line(2, r#"{"op":"upgrade"}"#).unwrap();
    assert!(reply.contains("\"ok\":true"), "{reply}");
    let after = scrape(&lab, 2);
    assert_eq!(sample(&after, count), Some(n), "{after}");
    assert_eq!(
        sample(&after, "msrd_handoff_duration_seconds_sum{role=\"new\"}"),
        sample(&before, "msrd_handoff_duration_seconds_sum{role=\"new\"}")
    );
    let (_, body) = http(&lab.ns(Host::Gw), metrics_addr(2), "GET", "/status.json").unwrap();
    let doc: StatusDoc = serde_json::from_str(&body).unwrap();
    assert_eq!(
        doc.handoffs.len(),
        records.len().min(50),
        "recent handoffs after the upgrade: {body}"
    );

    let (ok, out, err) = lab.wait(recv, Duration::from_secs(120)).unwrap();
    assert!(ok, "receiver: {out} {err}");
    lab.wait(send, Duration::from_secs(30)).unwrap();
}

/// A request with `Host: host` from namespace `ns`: its status.
fn status_with_host(ns: &str, to: SocketAddr, host: &str) -> io::Result<u16> {
    sys::in_netns(ns, || {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        write!(s, "GET /status.json HTTP/1.1\r\nHost: {host}\r\n\r\n")?;
        let mut out = Vec::new();
        s.read_to_end(&mut out)?;
        let out = String::from_utf8_lossy(&out).into_owned();
        out.split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| io::Error::other(format!("no status in {out:?}")))
    })
}

/// The metrics listener serves its own names only (a page on the LAN that rebinds its
/// DNS name to the MSR cannot read it), a few connections per source (64 slow clients
/// from one host must not lock the operator's scrape out), and nothing from the cells:
/// neither it nor the handoff channel port takes a connection arriving on a cell.
#[test]
fn the_metrics_listener_refuses_rebinding_slow_floods_and_the_cells() {
    let mut lab = Lab::new(LabConfig::clean(2, 137)).unwrap();
    lab.start_itcp_mobility(
        &format!("[metrics]\nlisten = \"{{MSR_LAN}}:{PORT}\"\n"),
        &["--hysteresis-ms", "0"],
    )
    .unwrap();
    let (gw, fh, mh) = (lab.ns(Host::Gw), lab.ns(Host::Fh), lab.ns(Host::Mh));
    let to = metrics_addr(1);
    let mut failures = Vec::new();

    // Host: our address and localhost are served; a name nobody configured is not.
    for host in [
        to.to_string(),
        addr::msr_lan(1).to_string(),
        "localhost".into(),
    ] {
        let st = status_with_host(&gw, to, &host);
        eprintln!("Host: {host} -> {st:?}");
        if st.as_ref().ok() != Some(&200) {
            failures.push(format!("Host: {host} answered {st:?}, not 200"));
        }
    }
    let st = status_with_host(&gw, to, "rebind.attacker.example:9473");
    eprintln!("Host: rebind.attacker.example:9473 -> {st:?}");
    if st.as_ref().ok() != Some(&403) {
        failures.push(format!("a foreign Host answered {st:?}, not 403"));
    }

    // 64 slow clients on one host (the GW) that never finish their request.
    let slow: Vec<TcpStream> = sys::in_netns(&gw, || {
        (0..64)
            .map(|_| {
                let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
                s.write_all(b"GET / HT")?;
                Ok(s)
            })
            .collect()
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // Those msrd closed at once (read returns 0 or an error without waiting).
    let closed = slow
        .iter()
        .filter(|s| {
            s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            let mut b = [0u8; 64];
            !matches!((&**s).read(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut)
        })
        .count();
    // The operator scrapes from another host meanwhile.
    let scrape = http(&fh, to, "GET", "/metrics");
    eprintln!(
        "64 slow clients from the GW: {closed} closed at once; a scrape from the FH meanwhile: {:?}",
        scrape.as_ref().map(|r| r.0)
    );
    if scrape.as_ref().map(|r| r.0).ok() != Some(200) {
        failures.push(format!("the operator's scrape failed: {scrape:?}"));
    }
    // The slow ones are dropped once the request-head deadline passes.
    std::thread::sleep(Duration::from_secs(6));
    let held = slow
        .iter()
        .filter(|s| {
            let mut b = [0u8; 64];
            matches!((&**s).read(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut)
        })
        .count();
    eprintln!("slow clients still open after 6 s: {held}");
    if held > 0 {
        failures.push(format!("{held} slow clients still held after 6 s"));
    }
    drop(slow);

    // From the MH (on MSR1's cell): the metrics port and the channel port of MSR1.
    for port in [PORT, 4347] {
        let a = SocketAddr::from((addr::msr_lan(1), port));
        let r = sys::in_netns(&mh, || {
            TcpStream::connect_timeout(&a, Duration::from_secs(2))
        });
        eprintln!("{a} from the MH: {:?}", r.as_ref().map(|_| "connected"));
        if r.is_ok() {
            failures.push(format!("{a} took a connection from the cell"));
        }
    }
    // ...still reachable on the LAN.
    let a = SocketAddr::from((addr::msr_lan(1), 4347));
    if let Err(e) = sys::in_netns(&gw, || {
        TcpStream::connect_timeout(&a, Duration::from_secs(2))
    }) {
        failures.push(format!("{a} is not reachable from the LAN: {e}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
