//! The old MSR's driver, as `proxy/src/handoff/old_side.rs::old_side` serves a
//! request with the real `OldSide`: one request per MH at a time, freeze and capture
//! (in parts), images, then the acknowledgement, a call-off, or the channel's loss.

use std::collections::BTreeSet;

use itcp_handoff::machine::{Action, MhKnown, OldEvent, OldSide, Request};
use itcp_proto::channel::{ConnImage, Message};

use super::world::{brief, brief_action, Ev, Fate, Inbox, OldDrv, Sock, Work, World};
use super::world::{End, TOKEN};
use super::Mutation;

/// A request opens the channel's old end: it waits for the MH's turn here.
pub fn request(w: &mut World, chan: usize, msg: Message) {
    let (msr, from) = (w.chans[chan].old_msr, w.chans[chan].new_msr);
    w.olds.push(OldDrv {
        msr,
        m: None,
        chan,
        from,
        request: msg,
        busy: None,
        rest: Default::default(),
        inbox: Default::default(),
        next: None,
        snapshot: BTreeSet::new(),
        frozen: BTreeSet::new(),
        sent_ahead: BTreeSet::new(),
        outcome: None,
        blind: false,
        finished: false,
    });
    let j = w.olds.len() - 1;
    w.chans[chan].old_drv = Some(j);
    if w.msrs[msr].turn.is_none() {
        start(w, j);
    } else {
        w.msrs[msr].waiting.push_back(j);
    }
}

fn tag(w: &World, j: usize) -> String {
    format!("{} old#{j}", w.msrs[w.olds[j].msr].name)
}

fn start(w: &mut World, j: usize) {
    let msr = w.olds[j].msr;
    w.msrs[msr].turn = Some(j);
    let Message::HandoffRequest {
        handoff_id,
        greeting,
        ..
    } = w.olds[j].request.clone()
    else {
        panic!("the simulated MH only greets");
    };
    let m = &w.msrs[msr];
    let running: BTreeSet<u64> = m
        .socks
        .iter()
        .filter(|(_, s)| **s == Sock::Running)
        .map(|(c, _)| *c)
        .collect();
    let known = MhKnown {
        token: m.rec.token.then_some(TOKEN),
        last_greeting_ts: m.rec.last_greeting_ts,
        mac: None,
        local: running.len(),
        moved_to: m.rec.moved_to.as_deref(),
        came_from: m.rec.came_from.as_deref(),
    };
    let from = w.msrs[w.olds[j].from].name.clone();
    let req = Request::Greeting(&greeting);
    let (machine, acts) = OldSide::start(&m.name, &from, handoff_id, req, known, w.now, w.timeouts);
    w.olds[j].m = Some(machine);
    w.olds[j].snapshot = running;
    let t = tag(w, j);
    w.trace_line(format!(
        "{t} serves {} from {from}",
        brief(&w.olds[j].request)
    ));
    run(w, j, acts);
}

fn run(w: &mut World, j: usize, acts: Vec<Action>) {
    if w.tracing() {
        for a in &acts {
            let line = format!("{}: {}", tag(w, j), brief_action(a));
            w.trace_line(line);
        }
    }
    w.olds[j].rest.extend(acts);
    resume(w, j);
}

fn machine(w: &mut World, j: usize) -> &mut OldSide {
    w.olds[j].m.as_mut().expect("started")
}

fn resume(w: &mut World, j: usize) {
    loop {
        if w.olds[j].finished {
            return;
        }
        while let Some(a) = w.olds[j].rest.pop_front() {
            if act(w, j, a) {
                return;
            }
        }
        let now = w.now;
        let acts = if let Some(ev) = w.olds[j].next.take() {
            machine(w, j).handle(ev, now)
        } else if machine(w, j).done() {
            return finish(w, j);
        } else {
            match w.olds[j].inbox.pop_front() {
                Some(Inbox::Msg(msg)) => {
                    let line = format!("{} <- {}", tag(w, j), brief(&msg));
                    w.trace_line(line);
                    w.olds[j].blind = false;
                    machine(w, j).handle(OldEvent::Message(msg), now)
                }
                Some(Inbox::Lost) => {
                    w.olds[j].blind = true;
                    machine(w, j).handle_channel_lost("channel closed")
                }
                None => return,
            }
        };
        if w.tracing() {
            for a in &acts {
                let line = format!("{}: {}", tag(w, j), brief_action(a));
                w.trace_line(line);
            }
        }
        w.olds[j].rest.extend(acts);
    }
}

fn act(w: &mut World, j: usize, a: Action) -> bool {
    let msr = w.olds[j].msr;
    match a {
        Action::GreetingUsed { ts_ms, .. } => {
            let rec = &mut w.msrs[msr].rec;
            rec.last_greeting_ts = rec.last_greeting_ts.max(ts_ms);
        }
        Action::CompleteHandshakes { .. } | Action::SendAhead(_) | Action::Reroute(_) => {}
        Action::Forget(_) => {}
        Action::FreezeAndCapture(_) => {
            freeze(w, j);
            w.olds[j].busy = Some(Work::Capture);
            let d = w.work_delay();
            w.after(d, Ev::OldWork { drv: j });
            return true;
        }
        Action::Send(msg) => send(w, j, msg),
        Action::Delete(ids) => delete(w, j, &ids),
        Action::Unfreeze(_) => unfreeze(w, j),
        Action::Log(r) => {
            w.saw(format!("old side {:?}", r.outcome));
            w.olds[j].outcome = Some(r.outcome)
        }
        other => {
            let t = tag(w, j);
            w.violate(format!("{t}: the driver drops {other:?}"));
        }
    }
    false
}

fn freeze(w: &mut World, j: usize) {
    let msr = w.olds[j].msr;
    for (c, s) in w.msrs[msr].socks.iter_mut() {
        if *s == Sock::Running {
            *s = Sock::Frozen(j);
            w.olds[j].frozen.insert(*c);
        }
    }
}

fn send(w: &mut World, j: usize, mut msg: Message) {
    if let Message::Images { images, .. } = &mut msg {
        if w.mutation == Mutation::DeleteBeforeAck {
            let ids: Vec<u64> = images.iter().map(|i| i.id).collect();
            drop_frozen(w, j, &ids);
        }
        let ahead = &w.olds[j].sent_ahead;
        images.retain(|i| !ahead.contains(&i.id));
    }
    let c = w.olds[j].chan;
    w.send(c, End::New, msg);
}

/// The frozen copies go without a packet: only those that resumed at the new MSR.
fn delete(w: &mut World, j: usize, ids: &[u64]) {
    let chan = w.olds[j].chan;
    for id in ids {
        let t = &w.conns[id];
        if t.fate == Fate::Live && !t.started.contains(&chan) {
            let tg = tag(w, j);
            w.violate(format!(
                "{tg}: deletes connection {id}, which did not resume at the new MSR"
            ));
        }
    }
    drop_frozen(w, j, ids);
    let to = w.msrs[w.olds[j].from].name.clone();
    w.msrs[w.olds[j].msr].rec.moved_to = Some(to);
}

fn drop_frozen(w: &mut World, j: usize, ids: &[u64]) {
    let msr = w.olds[j].msr;
    for id in ids {
        if w.msrs[msr].socks.get(id) == Some(&Sock::Frozen(j)) {
            w.msrs[msr].socks.remove(id);
        }
        w.olds[j].frozen.remove(id);
    }
}

fn unfreeze(w: &mut World, j: usize) {
    let (msr, chan, blind) = (w.olds[j].msr, w.olds[j].chan, w.olds[j].blind);
    for id in std::mem::take(&mut w.olds[j].frozen) {
        if blind && w.chans[chan].cut {
            // Without the new MSR's word (channel lost, call-off unanswered): if it
            // restarted this one, it now runs twice, the price the machine accepts
            // for a failed channel (machine.rs module docs).
            w.conns
                .get_mut(&id)
                .expect("known")
                .unfrozen_blind
                .insert(chan);
        }
        if w.msrs[msr].socks.get(&id) == Some(&Sock::Frozen(j)) {
            w.msrs[msr].socks.insert(id, Sock::Running);
            super::check::started_running(w, id);
        }
    }
}

pub fn work_done(w: &mut World, j: usize) {
    if w.olds[j].finished {
        return;
    }
    w.olds[j].busy = None;
    captured(w, j);
    resume(w, j);
}

/// What capturing each frozen connection came to, as `FreezeAndCapture` in the
/// daemon sorts it: moved, finished, stuck here, or changed (the handoff is off).
fn captured(w: &mut World, j: usize) {
    let f = w.sc.faults.clone();
    let ids: Vec<u64> = w.olds[j].frozen.iter().copied().collect();
    let (mut images, mut stuck, mut failure) = (Vec::new(), Vec::new(), None::<String>);
    let mut changed_at = None;
    for (n, id) in ids.iter().enumerate() {
        if failure.is_some() {
            continue; // Captured or not, it resumes here (Unfreeze follows).
        }
        if w.rng.chance(f.capture_over) {
            finished_while_frozen(w, j, *id);
        } else if w.rng.chance(f.capture_changed) {
            failure = Some(format!("connection {id} changed while captured"));
            changed_at = Some(n);
        } else if w.rng.chance(f.capture_stuck) {
            stuck.push((*id, "could not capture".to_string()));
        } else {
            images.push(image(*id));
        }
    }
    send_parts(w, j, &ids, &images, changed_at);
    let ev = match failure {
        None if images.is_empty() && !stuck.is_empty() => {
            OldEvent::CaptureFailed("no connection could be captured".into())
        }
        None => {
            if !stuck.is_empty() {
                let now = w.now;
                let ignored = machine(w, j).handle(OldEvent::Uncaptured(stuck), now);
                if !ignored.is_empty() {
                    let t = tag(w, j);
                    w.violate(format!("{t}: the driver drops {ignored:?}"));
                }
            }
            OldEvent::Captured(images)
        }
        Some(reason) => OldEvent::CaptureFailed(reason),
    };
    w.olds[j].next = Some(ev);
}

fn finished_while_frozen(w: &mut World, j: usize, id: u64) {
    let msr = w.olds[j].msr;
    w.msrs[msr].socks.remove(&id);
    w.olds[j].frozen.remove(&id);
    w.conns.get_mut(&id).expect("known").fate = Fate::Ended;
    let t = tag(w, j);
    w.trace_line(format!("{t}: connection {id} finished while frozen"));
}

fn image(id: u64) -> ConnImage {
    ConnImage {
        id,
        kind: "connect".into(),
        ..Default::default()
    }
}

/// `capture_in_parts`: with enough connections, every part but the last goes ahead
/// as it is captured, until a capture shows a changed connection.
fn send_parts(
    w: &mut World,
    j: usize,
    ids: &[u64],
    images: &[ConnImage],
    changed_at: Option<usize>,
) {
    let part = w.sc.part;
    if part == 0 || ids.len() < 2 * part {
        return;
    }
    let chunks: Vec<&[u64]> = ids.chunks(part).collect();
    let last = chunks.len() - 1;
    for (k, chunk) in chunks.into_iter().enumerate() {
        let end = (k + 1) * part;
        if k == last || changed_at.is_some_and(|c| c < end) {
            break;
        }
        let imgs: Vec<ConnImage> = images
            .iter()
            .filter(|i| chunk.contains(&i.id))
            .cloned()
            .collect();
        w.olds[j].sent_ahead.extend(imgs.iter().map(|i| i.id));
        let handoff_id = w.olds[j].m.as_ref().expect("started").handoff_id;
        let c = w.olds[j].chan;
        w.send(
            c,
            End::New,
            Message::ImagesPart {
                handoff_id,
                images: imgs,
            },
        );
    }
}

fn finish(w: &mut World, j: usize) {
    w.olds[j].finished = true;
    let msr = w.olds[j].msr;
    let left: Vec<u64> = w.olds[j].frozen.iter().copied().collect();
    if !left.is_empty() {
        let t = tag(w, j);
        w.violate(format!(
            "{t}: frozen copies {left:?} left behind when the handoff ended (lost)"
        ));
    }
    super::check::old_ended(w, j);
    let c = w.olds[j].chan;
    w.close_end(c, End::Old);
    w.msrs[msr].turn = None;
    if let Some(next) = w.msrs[msr].waiting.pop_front() {
        start(w, next);
    }
}

pub fn receive(w: &mut World, j: usize, item: Inbox) {
    if w.olds[j].finished {
        return;
    }
    w.olds[j].inbox.push_back(item);
    if w.olds[j].m.is_some() && w.olds[j].busy.is_none() {
        resume(w, j);
    }
}

/// The machine's deadline passed (the ack's, then the call-off's).
pub fn timeout(w: &mut World, j: usize) {
    let t = tag(w, j);
    w.trace_line(format!("{t}: deadline"));
    w.olds[j].blind = true;
    let now = w.now;
    let mut acts = machine(w, j).handle_timeout(now);
    let calls_off = acts
        .iter()
        .any(|a| matches!(a, Action::Send(Message::Abort { .. })));
    if calls_off && w.mutation == Mutation::UnfreezeAtCallOff {
        // The mutation: serve on at the ack's deadline instead of awaiting the answer.
        acts.push(Action::Unfreeze(super::world::mh_addr()));
    }
    run(w, j, acts);
}
