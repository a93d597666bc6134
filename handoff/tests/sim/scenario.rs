//! What one seed plays: how many MSRs and connections, how faulty the channel, the
//! air and the sockets are, and the MH's moves, crashes and replays over time.

use super::rng::Rng;

/// Probabilities of every fault the world can inject (each scenario draws its own,
/// often zero, so clean runs and hostile ones both occur).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// A channel message is lost: TCP's stream is broken there (nothing after it
    /// arrives), as after a cut or a reset.
    pub msg_loss: f64,
    /// An end never hears of a cut (a partition): only its timers end its wait.
    pub silent_cut: f64,
    /// A channel message arrives twice (a peer re-sending, a misbehaving one).
    pub dup: f64,
    /// A channel message takes 0.1–7 s (past the machines' deadlines).
    pub slow_msg: f64,
    /// A connection changed while it was captured: the handoff is off.
    pub capture_changed: f64,
    /// A connection cannot be captured: it stays at the old MSR.
    pub capture_stuck: f64,
    /// A connection finished while frozen: nothing to move.
    pub capture_over: f64,
    pub restore_fail: f64,
    pub restart_fail: f64,
    /// Capture, restore or restart takes seconds (many connections, a loaded host).
    pub slow_work: f64,
    /// A greeting or an answer lost on the air.
    pub radio_loss: f64,
}

/// A scripted happening at a given time.
#[derive(Debug, Clone)]
pub enum Script {
    /// The MH now hears these cells (MSR indices): none in a gap, two in an overlap.
    Cells(Vec<usize>),
    Crash(usize),
    Restart(usize),
    /// The MH opens a connection through the MSR it is attached to.
    Open,
    /// The MH's last greeting is sent again later (the air, or an attacker replaying).
    Replay,
    /// A greeting for the MH under a wrong token reaches this MSR.
    Forge(usize),
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub msrs: usize,
    pub conns: usize,
    /// Images sent ahead in parts of this many connections (0: one message); the
    /// daemon's parts are 256, scaled down so that few connections exercise them.
    pub part: usize,
    pub faults: Faults,
    pub script: Vec<(u64, Script)>,
}

const MS: u64 = 1000;

fn level(r: &mut Rng, low: f64, high: f64) -> f64 {
    r.pick(&[0.0, 0.0, low, high])
}

fn faults(r: &mut Rng) -> Faults {
    Faults {
        msg_loss: level(r, 0.02, 0.15),
        silent_cut: r.pick(&[0.0, 0.5, 1.0]),
        dup: level(r, 0.05, 0.3),
        slow_msg: level(r, 0.02, 0.15),
        capture_changed: level(r, 0.05, 0.3),
        capture_stuck: level(r, 0.05, 0.3),
        capture_over: level(r, 0.05, 0.2),
        restore_fail: level(r, 0.05, 0.4),
        restart_fail: level(r, 0.05, 0.4),
        slow_work: level(r, 0.02, 0.2),
        radio_loss: level(r, 0.05, 0.3),
    }
}

/// The MH's moves: clean, through a gap (no cell), or through an overlap (both).
fn moves(r: &mut Rng, msrs: usize, script: &mut Vec<(u64, Script)>) -> u64 {
    let (mut t, mut cell) = (0, 0usize);
    for _ in 0..r.range(1, 10) {
        t += r.range(20 * MS, 2500 * MS);
        let next = (cell + r.range(1, msrs as u64 - 1) as usize) % msrs;
        match r.below(3) {
            0 => {}
            1 => {
                script.push((t, Script::Cells(vec![])));
                t += r.range(10 * MS, 1500 * MS);
            }
            _ => {
                script.push((t, Script::Cells(vec![cell, next])));
                t += r.range(10 * MS, 1000 * MS);
            }
        }
        script.push((t, Script::Cells(vec![next])));
        cell = next;
    }
    t
}

pub fn generate(seed: u64) -> Scenario {
    let mut r = Rng::new(seed ^ 0x5EED_0F5C_E4A2_1000);
    let msrs = r.range(2, 3) as usize;
    let mut script = Vec::new();
    let end = moves(&mut r, msrs, &mut script) + 1000 * MS;
    for _ in 0..r.pick(&[0, 0, 1, 2]) {
        let (at, msr) = (r.below(end), r.below(msrs as u64) as usize);
        script.push((at, Script::Crash(msr)));
        script.push((at + r.range(5 * MS, 3000 * MS), Script::Restart(msr)));
    }
    for _ in 0..r.pick(&[0, 0, 1, 3]) {
        script.push((r.below(end), Script::Open));
    }
    if r.chance(0.2) {
        script.push((r.below(end), Script::Replay));
    }
    if r.chance(0.1) {
        script.push((r.below(end), Script::Forge(r.below(msrs as u64) as usize)));
    }
    script.sort_by_key(|(t, _)| *t);
    Scenario {
        msrs,
        conns: r.range(1, 6) as usize,
        part: r.pick(&[0, 0, 1, 2, 3]),
        faults: faults(&mut r),
        script,
    }
}
