//! The invariants, checked after every step and once the world is at rest.

use itcp_handoff::log::Outcome;

use super::world::{Fate, Life, Sock, World};

/// Where a live connection has copies: MSRs running it, and frozen copies.
fn copies(w: &World, id: u64) -> (Vec<usize>, usize) {
    let (mut running, mut frozen) = (Vec::new(), 0);
    for (i, m) in w.msrs.iter().enumerate() {
        match m.socks.get(&id) {
            Some(Sock::Running) => running.push(i),
            Some(Sock::Frozen(_)) => frozen += 1,
            _ => {}
        }
    }
    (running, frozen)
}

/// A connection forked by a failed channel: its old MSR unfroze it without word and
/// its new MSR restarted it (both copies may have moved on since). The one
/// duplication the machine accepts (machine.rs: "Only a new MSR that stays silent,
/// or a channel that fails, leaves the old MSR to unfreeze and serve on"). Which: 0
/// when the new MSR restarted it before it could know, 1 when it had heard of the
/// failure already (it restarts all the same: the old MSR may have crashed, its
/// frozen copies gone, and then the restart saves the connections).
fn accepted_duplicate(w: &World, id: u64) -> Option<usize> {
    let t = &w.conns[&id];
    let c = t.started.intersection(&t.unfrozen_blind).next()?;
    Some(usize::from(t.started_after_loss.contains(c)))
}

/// A copy of `id` starts running: never at two MSRs at once. Checked as it happens,
/// since one step may start a copy and freeze the other again.
pub fn started_running(w: &mut World, id: u64) {
    if w.conns[&id].fate != Fate::Live {
        return;
    }
    let (running, _) = copies(w, id);
    if running.len() < 2 {
        return;
    }
    if let Some(kind) = accepted_duplicate(w, id) {
        // Counted, then out of the game: one of its copies will be reset.
        w.hazards[kind] += 1;
        w.trace_line(format!(
            "hazard: connection {id} runs twice after a failed channel"
        ));
        w.conns.get_mut(&id).expect("known").fate = Fate::Reset;
        return;
    }
    let at: Vec<&str> = running.iter().map(|&m| w.msrs[m].name.as_str()).collect();
    w.violate(format!("connection {id} runs at {at:?} at once"));
}

pub fn after_step(w: &mut World) {
    let ids: Vec<u64> = w.conns.keys().copied().collect();
    for id in ids {
        if w.conns[&id].fate != Fate::Live {
            continue;
        }
        let (running, frozen) = copies(w, id);
        if running.len() > 1 {
            started_running(w, id);
        } else if running.is_empty() && frozen == 0 && !w.conns[&id].orphaned {
            return w.violate(format!("connection {id} is lost: no MSR runs or holds it"));
        }
    }
    timers_armed(w);
}

/// Every machine that waits on its peer has a deadline.
fn timers_armed(w: &mut World) {
    for (i, d) in w.news.iter().enumerate() {
        let waits = d.life == Life::Active && d.busy.is_none() && !d.m.done();
        if waits && d.m.poll_timeout().is_none() {
            return w.violate(format!("new#{i} waits with no timer armed"));
        }
    }
    for (j, d) in w.olds.iter().enumerate() {
        let Some(m) = d.m.as_ref() else { continue };
        let waits = !d.finished && d.busy.is_none() && !m.done();
        if waits && m.poll_timeout().is_none() {
            return w.violate(format!("old#{j} waits with no timer armed"));
        }
    }
}

/// An old side that moved nothing (rolled back, refused, or nothing to move)
/// leaves its MSR serving every connection it had, as it was.
pub fn old_ended(w: &mut World, j: usize) {
    let d = &w.olds[j];
    if matches!(d.outcome, Some(Outcome::Moved | Outcome::Partial)) {
        return;
    }
    let m = &w.msrs[d.msr];
    let missing: Vec<u64> = d
        .snapshot
        .iter()
        .copied()
        .filter(|c| w.conns[c].fate == Fate::Live && m.socks.get(c) != Some(&Sock::Running))
        .collect();
    if !missing.is_empty() {
        let (name, o) = (m.name.clone(), d.outcome);
        w.violate(format!(
            "{name} old#{j} ended {o:?} without serving {missing:?} as before"
        ));
    }
}

/// At rest: every machine done, every live connection running at exactly one MSR,
/// nothing frozen or restored left, no pull or request still marked under way.
pub fn at_rest(w: &mut World) {
    if let Some(i) = w.news.iter().position(|d| d.life != Life::Finished) {
        return w.violate(format!("new#{i} never finished"));
    }
    if let Some(j) = w.olds.iter().position(|d| !d.finished) {
        return w.violate(format!("old#{j} never finished"));
    }
    for m in &w.msrs {
        if m.socks.values().any(|s| *s != Sock::Running) {
            let what = format!("{} keeps frozen or restored copies at rest", m.name);
            return w.violate(what);
        }
        if m.up && (m.rec.pulling || m.turn.is_some() || !m.waiting.is_empty()) {
            let what = format!("{} still marks a handoff of the MH under way", m.name);
            return w.violate(what);
        }
    }
    let ids: Vec<u64> = w.conns.keys().copied().collect();
    for id in ids {
        let t = &w.conns[&id];
        let (running, _) = copies(w, id);
        if t.fate == Fate::Live && running.len() != 1 && !(t.orphaned && running.is_empty()) {
            return w.violate(format!("connection {id} at rest runs at {running:?}"));
        }
    }
}
