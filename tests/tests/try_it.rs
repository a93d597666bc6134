//! docs/try-it.md works as written: `itcp-lab up --itcp` starts a lab and prints the
//! page's commands (each one must be on the page as printed), then every `sh` block of
//! the page runs, in order, with the variables the lab printed, and must succeed (a
//! block preceded by `<!-- try-it: skip` is left out: it keeps running). Ctrl-C (SIGINT)
//! to itcp-lab must remove the whole lab. A bare `itcp-lab up` prints the hosts by
//! their names (MSR1, not `Msr(1)`). Needs root, curl and chromium.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use itcp_testbed::lab::{bin_path, list_lab_namespaces};

/// `itcp-lab up ARGS`, its stdout read up to the line saying how to end it.
struct Up {
    child: Child,
    out: Vec<String>,
}

impl Up {
    fn start(args: &[&str]) -> Up {
        let mut child = Command::new(bin_path("itcp-lab"))
            .arg("up")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) => {
                    let done = l.starts_with("Ctrl-C");
                    out.push(l);
                    if done {
                        break;
                    }
                }
                Err(_) => panic!("itcp-lab up {args:?} not ready in 60 s: {out:#?}"),
            }
        }
        Up { child, out }
    }

    /// Ctrl-C, as a person would; the lab must be gone after it.
    fn stop(mut self) {
        let id = self.child.id();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(id as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "itcp-lab up ignored SIGINT");
            std::thread::sleep(Duration::from_millis(100));
        }
        let prefix = format!("itcp-{id}-");
        let left: Vec<String> = list_lab_namespaces()
            .into_keys()
            .filter(|k| k.starts_with(&prefix))
            .collect();
        assert!(left.is_empty(), "left after Ctrl-C: {left:?}");
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        // SAFETY: signalling our own child (a failed test still removes its lab).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
    }
}

/// The `sh` blocks of a Markdown page, without those marked to skip.
fn sh_blocks(page: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut lines = page.lines().peekable();
    let mut skip = false;
    while let Some(l) = lines.next() {
        if l.starts_with("<!-- try-it: skip") {
            skip = true;
            continue;
        }
        if l == "```sh" {
            let mut b = Vec::new();
            for l in lines.by_ref() {
                if l == "```" {
                    break;
                }
                b.push(l);
            }
            if !skip {
                blocks.push(b.join("\n"));
            }
        }
        if !l.trim().is_empty() {
            skip = false;
        }
    }
    blocks
}

#[test]
fn the_try_it_walkthrough_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let page = std::fs::read_to_string(root.join("docs/try-it.md")).unwrap();

    let up = Up::start(&["--itcp"]);
    let out = up.out.join("\n");
    eprintln!("{out}");
    assert!(!out.contains("Msr("), "debug names: {out}");
    // The variables, as a person pastes them.
    let mut env: Vec<(String, String)> = Vec::new();
    for l in up.out.iter().filter_map(|l| l.strip_prefix("export ")) {
        for kv in l.split_whitespace() {
            let (k, v) = kv.split_once('=').unwrap();
            env.push((k.into(), v.into()));
        }
    }
    let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    for k in [
        "LAB", "BIN", "FH_NS", "GW_NS", "MSR1_NS", "MSR2_NS", "MH_NS", "MH2_NS",
    ] {
        assert!(names.contains(&k), "no {k} in {names:?}");
    }
    // Every command it prints is on the page as printed.
    let mut printed = 0;
    let mut lines = up.out.iter().peekable();
    while let Some(l) = lines.next() {
        if l.starts_with("# ") {
            let mut cmd = Vec::new();
            while let Some(c) = lines.next_if(|c| !c.is_empty()) {
                cmd.push(c.as_str());
            }
            let cmd = cmd.join("\n");
            if !cmd.is_empty() {
                assert!(page.contains(&cmd), "try-it.md lacks the command\n{cmd}");
                printed += 1;
            }
        }
    }
    assert!(printed >= 8, "{printed} commands printed: {out}");

    // The walkthrough, block by block.
    let blocks = sh_blocks(&page);
    assert!(blocks.len() >= 7, "{blocks:#?}");
    let mut outputs = Vec::new();
    for b in &blocks {
        let started = Instant::now();
        let o = Command::new("timeout")
            .args(["60", "sh", "-ec", b])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        let (so, se) = (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        );
        eprintln!("$ {b}\n{so}{se}({:.1} s)", started.elapsed().as_secs_f64());
        assert!(o.status.success(), "{b}\nfailed: {:?}\n{so}{se}", o.status);
        outputs.push(so);
    }
    let all = outputs.join("\n");
    // What the page says happens, happened.
    // The agent's greeting or MSR2's own detection moves the connection, whichever
    // comes first (the page says so); the handoff log shows it either way.
    assert!(
        all.contains("\"event\":\"moved\"") || all.contains("\"msr\":\"msr2\",\"connections\":0"),
        "no move in: {all}"
    );
    assert!(
        all.matches("200 1000000 bytes").count() == 2,
        "both curls fetch a megabyte: {all}"
    );
    assert!(
        all.contains("msr1 → msr2") && all.contains("moved"),
        "{all}"
    );
    // MH2, which runs nothing of ours, kept its download across its move.
    assert!(all.contains("200 3000000 bytes"), "MH2's download: {all}");
    assert!(
        all.lines()
            .any(|l| l.contains("10.2.0.101") && l.contains("msr1 → msr2") && l.contains("moved")),
        "no handoff of MH2 in: {all}"
    );
    let lab = &env.iter().find(|(k, _)| k == "LAB").unwrap().1;
    let rr = std::fs::read_to_string(Path::new(lab).join("rr.json")).unwrap();
    let rr: serde_json::Value = serde_json::from_str(rr.trim()).unwrap();
    assert_eq!(rr["ok"], true, "{rr}");
    up.stop();

    // The bare lab names its hosts as people do.
    let bare = Up::start(&["--msrs", "2"]);
    let out = bare.out.join("\n");
    assert!(out.contains("  MSR1 ") && out.contains("  MH "), "{out}");
    assert!(!out.contains("Msr("), "{out}");
    bare.stop();
}
