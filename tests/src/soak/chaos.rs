//! The soak's chaos: random moves of every MH among the cells, and faults injected at
//! random times or at a random phase of a handoff.
//!
//! Moves: each MH dwells 1.5–7 s in a cell, then crosses to another one — overlapped
//! (both cells for 0.2–2 s), through a blackout (no cell for 0.05–1.5 s) or at once.
//!
//! Faults, one at a time, every 3–9 s:
//! * `kill_old` / `kill_new`: at the next crossing of any MH, 0–0.4 s after it enters
//!   the new cell (the greeting, the pull, the freeze, the transfer or the restart is
//!   under way), the MSR it leaves or the one it enters gets SIGKILL; msrd is started
//!   again 0.3–4 s later. Just before the kill, the victim's session list is read: the
//!   connections it held.
//! * `kill_any`: the same for a random MSR at a random time.
//! * `channel_cut`: the MSR⇄MSR channel port (TCP 4347) dropped both ways inside one
//!   MSR's namespace for 1–6 s, mostly at a crossing from or to that MSR.
//! * `greeting_loss`: the greeting port (UDP 4346) dropped both ways at one MSR for
//!   1–5 s, mostly the one an MH is about to greet.
//! * `cell_flush`: one cell's neighbour table (`ip neigh flush dev cell0` at its MSR)
//!   and every frame the emulator has queued in it, both ways.

use std::io;
use std::net::SocketAddr;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use super::{uniform, Shared};
use crate::lab::{Host, Lab};
use crate::rng::{derive_seed, SplitMix64};

/// How an MH crossed between cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Style {
    Overlap,
    Gap,
    Switch,
}

/// One move the soak made. Times are seconds on the soak's clock.
#[derive(Debug, Clone, Serialize)]
pub struct Crossing {
    pub mh: usize,
    pub from: usize,
    pub to: usize,
    pub style: Style,
    pub start: f64,
    /// When the MH is (planned to be) in the new cell.
    pub enters: f64,
    /// When it is in the new cell only.
    pub end: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    KillOld,
    KillNew,
    KillAny,
    ChannelCut,
    GreetingLoss,
    CellFlush,
}

impl FaultKind {
    pub const ALL: [FaultKind; 6] = [
        FaultKind::KillOld,
        FaultKind::KillNew,
        FaultKind::KillAny,
        FaultKind::ChannelCut,
        FaultKind::GreetingLoss,
        FaultKind::CellFlush,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillOld => "kill_old",
            FaultKind::KillNew => "kill_new",
            FaultKind::KillAny => "kill_any",
            FaultKind::ChannelCut => "channel_cut",
            FaultKind::GreetingLoss => "greeting_loss",
            FaultKind::CellFlush => "cell_flush",
        }
    }

    pub fn is_kill(self) -> bool {
        matches!(
            self,
            FaultKind::KillOld | FaultKind::KillNew | FaultKind::KillAny
        )
    }
}

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    pub kind: FaultKind,
    pub msr: usize,
    /// When it took effect (the SIGKILL, the first drop).
    pub start: f64,
    /// When it was undone (msrd answering again, the rule removed); = start for a flush.
    pub end: f64,
    /// The MH whose crossing it was aimed at.
    pub mh: Option<usize>,
    /// Kills: the connections the victim held just before (the MH's address and port
    /// as the FH sees them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<SocketAddr>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// An msrd process: the one the lab started (`child: None`, the lab owns it) or a
/// restart the soak owns.
pub struct Msrd {
    pub pid: u32,
    pub child: Option<Child>,
    pub restarts: usize,
}

/// Sleeps `s` seconds in small steps; true if `stop` was set meanwhile.
fn nap(shared: &Shared, stop: &AtomicBool, s: f64) -> bool {
    let until = shared.clock.now() + s;
    while shared.clock.now() < until {
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20).min(Duration::from_secs_f64(
            (until - shared.clock.now()).max(0.001),
        )));
    }
    stop.load(Ordering::Relaxed)
}

fn sleep_s(s: f64) {
    std::thread::sleep(Duration::from_secs_f64(s.max(0.0)));
}

/// Moves MH `j` until the chaos stops; it ends in exactly one cell.
pub fn mover(lab: &Lab, shared: &Shared, j: usize, seed: u64) -> io::Result<()> {
    let mut rng = SplitMix64::new(derive_seed(seed, &format!("move{j}")));
    let cells = lab.msrs();
    let mut at = lab.config.initial_cells.first().copied().unwrap_or(1);
    let mut first = true;
    if cells < 2 {
        return Ok(());
    }
    loop {
        let dwell = if first {
            uniform(&mut rng, 0.2, 3.0)
        } else {
            uniform(&mut rng, 1.5, 7.0)
        };
        first = false;
        if nap(shared, &shared.stop_chaos, dwell) {
            break;
        }
        let to = loop {
            let c = 1 + (rng.next_u64() % cells as u64) as usize;
            if c != at {
                break c;
            }
        };
        let r = rng.next_f64();
        let (style, d) = if r < 0.4 {
            (Style::Overlap, uniform(&mut rng, 0.2, 2.0))
        } else if r < 0.7 {
            (Style::Gap, uniform(&mut rng, 0.05, 1.5))
        } else {
            (Style::Switch, 0.0)
        };
        let start = shared.clock.now();
        let (enters, end) = match style {
            Style::Overlap => (start, start + d),
            Style::Gap => (start + d, start + d),
            Style::Switch => (start, start),
        };
        shared.crossings.lock().unwrap().push(Crossing {
            mh: j,
            from: at,
            to,
            style,
            start,
            enters,
            end,
        });
        match style {
            Style::Overlap => lab.assoc_mh(j, &[at, to])?,
            Style::Gap => lab.assoc_mh(j, &[])?,
            Style::Switch => {}
        }
        sleep_s(d);
        lab.assoc_mh(j, &[to])?;
        at = to;
    }
    Ok(())
}

/// Waits for the next crossing any MH starts (None if the chaos stops first or none
/// comes in 15 s).
fn next_crossing(shared: &Shared) -> Option<Crossing> {
    let n = shared.crossings.lock().unwrap().len();
    let deadline = shared.clock.now() + 15.0;
    while shared.clock.now() < deadline {
        if shared.stop_faults.load(Ordering::Relaxed) {
            return None;
        }
        if let Some(c) = shared.crossings.lock().unwrap().get(n) {
            return Some(c.clone());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// Waits until `t` on the soak's clock.
fn until(shared: &Shared, t: f64) {
    sleep_s(t - shared.clock.now());
}

fn nft(lab: &Lab, k: usize, script: &str) -> io::Result<()> {
    use std::io::Write;
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &lab.ns(Host::Msr(k)), "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child.stdin.take().unwrap().write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "nft in MSR{k}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The nftables table the faults use in an MSR's namespace (not msrd's).
pub const CHAOS_TABLE: &str = "soak_chaos";

fn drop_rules(what: &str) -> String {
    let (i, o) = match what {
        "channel" => (
            "tcp dport 4347 drop\n    tcp sport 4347 drop",
            "tcp dport 4347 drop\n    tcp sport 4347 drop",
        ),
        _ => ("udp dport 4346 drop", "udp sport 4346 drop"),
    };
    format!(
        "table inet {CHAOS_TABLE} {{\n  chain in {{\n    type filter hook input priority -500; policy accept;\n    {i}\n  }}\n  chain out {{\n    type filter hook output priority -500; policy accept;\n    {o}\n  }}\n}}\n"
    )
}

/// How long a restart after SIGKILL is retried (once a second) before the soak gives up.
const RESTART_PATIENCE_S: f64 = 120.0;

/// Starts msrd on MSR k again (see [`faults`]).
pub type Restart<'a> = &'a dyn Fn(usize) -> io::Result<Child>;

/// SIGKILLs MSR `k`'s msrd (after reading the sessions it holds), waits `down` seconds
/// and starts it again.
#[allow(clippy::too_many_arguments)]
fn kill_and_restart(
    lab: &Lab,
    shared: &Shared,
    msrds: &Mutex<Vec<Msrd>>,
    restart: Restart,
    k: usize,
    kind: FaultKind,
    mh: Option<usize>,
    down: f64,
) -> io::Result<Fault> {
    let held: Vec<SocketAddr> = lab
        .msrd_sessions(k)
        .map(|v| v.into_iter().map(|s| s.mh).collect())
        .unwrap_or_default();
    let start = {
        let mut m = msrds.lock().unwrap();
        let p = &mut m[k - 1];
        // SAFETY: a plain kill of the msrd process this lab started (a zombie keeps
        // the pid until it is reaped, so it cannot be someone else's yet).
        unsafe { libc::kill(p.pid as i32, libc::SIGKILL) };
        let t = shared.clock.now();
        if let Some(c) = &mut p.child {
            let _ = c.wait();
        }
        t
    };
    sleep_s(down);
    let mut note = String::new();
    let first_try = shared.clock.now();
    let mut failures = 0;
    loop {
        match restart(k) {
            Ok(c) => {
                let mut m = msrds.lock().unwrap();
                let p = &mut m[k - 1];
                p.pid = c.id();
                p.child = Some(c);
                p.restarts += 1;
                break;
            }
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    // What holds the MSR's ports: for the report.
                    let ss = lab
                        .run(Host::Msr(k), "ss", &["-tanoH", "state", "all"])
                        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_default();
                    let held: Vec<&str> = ss
                        .lines()
                        .filter(|l| l.contains(":1080") || l.contains(":4347"))
                        .take(12)
                        .collect();
                    let why = e.to_string();
                    let why = why
                        .lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or("");
                    note += &format!(
                        "restart failed: {why}; sockets on the MSR's ports then: [{}]",
                        held.join(" | ")
                    );
                }
                if shared.clock.now() - first_try > RESTART_PATIENCE_S {
                    note += &format!(
                        "; msrd did not start again in {RESTART_PATIENCE_S} s ({failures} attempts)"
                    );
                    shared.faults.lock().unwrap().push(Fault {
                        kind,
                        msr: k,
                        start,
                        end: shared.clock.now(),
                        mh,
                        held,
                        note: note.clone(),
                    });
                    return Err(io::Error::other(format!(
                        "msrd on MSR{k} did not start again within {RESTART_PATIENCE_S} s of its SIGKILL: {note}"
                    )));
                }
                sleep_s(1.0);
            }
        }
    }
    if failures > 0 {
        note += &format!(
            "; msrd started again after {failures} failed attempts, {:.1} s after the first",
            shared.clock.now() - first_try
        );
    }
    Ok(Fault {
        kind,
        msr: k,
        start,
        end: shared.clock.now(),
        mh,
        held,
        note,
    })
}

/// Injects faults until the chaos stops; everything it did is undone when it returns.
/// `restart` starts msrd again: on a thread that outlives the soak, since a process the
/// lab starts dies with the thread that started it (PR_SET_PDEATHSIG).
pub fn faults(
    lab: &Lab,
    shared: &Shared,
    msrds: &Mutex<Vec<Msrd>>,
    restart: Restart,
    seed: u64,
) -> io::Result<()> {
    let mut rng = SplitMix64::new(derive_seed(seed, "faults"));
    let n = lab.msrs();
    if nap(shared, &shared.stop_faults, 3.0) {
        return Ok(());
    }
    loop {
        if nap(shared, &shared.stop_faults, uniform(&mut rng, 3.0, 9.0)) {
            return Ok(());
        }
        let r = rng.next_f64();
        let any_msr = |rng: &mut SplitMix64| 1 + (rng.next_u64() % n as u64) as usize;
        let f = if r < 0.3 {
            let Some(c) = next_crossing(shared) else {
                continue;
            };
            let old = rng.chance(0.5);
            let (k, kind) = if old {
                (c.from, FaultKind::KillOld)
            } else {
                (c.to, FaultKind::KillNew)
            };
            until(shared, c.enters + uniform(&mut rng, 0.0, 0.4));
            let down = uniform(&mut rng, 0.3, 4.0);
            kill_and_restart(lab, shared, msrds, restart, k, kind, Some(c.mh), down)?
        } else if r < 0.4 {
            let k = any_msr(&mut rng);
            let down = uniform(&mut rng, 0.3, 4.0);
            kill_and_restart(
                lab,
                shared,
                msrds,
                restart,
                k,
                FaultKind::KillAny,
                None,
                down,
            )?
        } else if r < 0.75 {
            let channel = r < 0.6;
            let (kind, dur) = if channel {
                (FaultKind::ChannelCut, uniform(&mut rng, 1.0, 6.0))
            } else {
                (FaultKind::GreetingLoss, uniform(&mut rng, 1.0, 5.0))
            };
            let (k, mh) = if rng.chance(0.7) {
                match next_crossing(shared) {
                    Some(c) => {
                        if channel {
                            until(shared, c.enters + uniform(&mut rng, 0.0, 0.2));
                            (if rng.chance(0.5) { c.from } else { c.to }, Some(c.mh))
                        } else {
                            (c.to, Some(c.mh))
                        }
                    }
                    None => continue,
                }
            } else {
                (any_msr(&mut rng), None)
            };
            nft(
                lab,
                k,
                &drop_rules(if channel { "channel" } else { "greeting" }),
            )?;
            let start = shared.clock.now();
            sleep_s(dur);
            nft(lab, k, &format!("delete table inet {CHAOS_TABLE}\n"))?;
            Fault {
                kind,
                msr: k,
                start,
                end: shared.clock.now(),
                mh,
                held: Vec::new(),
                note: String::new(),
            }
        } else {
            let k = any_msr(&mut rng);
            let out = lab.run(Host::Msr(k), "ip", &["neigh", "flush", "dev", "cell0"])?;
            let start = shared.clock.now();
            lab.flush_cell(k)?;
            Fault {
                kind: FaultKind::CellFlush,
                msr: k,
                start,
                end: start,
                mh: None,
                held: Vec::new(),
                note: if out.status.success() {
                    String::new()
                } else {
                    String::from_utf8_lossy(&out.stderr).trim().to_string()
                },
            }
        };
        shared.faults.lock().unwrap().push(f);
    }
}
