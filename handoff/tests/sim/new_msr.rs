//! The new MSR's driver, as `proxy/src/handoff/new_side.rs::run` carries out the
//! real `NewSide`'s actions and feeds their results back: one batch of actions at a
//! time, then the batch's event, a lost/refused channel, or the channel's next read.

use itcp_handoff::log::Outcome;
use itcp_handoff::machine::{Action, NewEvent, NewSide, CALL_OFF_WAIT_US};
use itcp_proto::channel::{ConnImage, Message};
use itcp_proto::greeting::Greeting;

use super::mh::{reply, Status};
use super::world::{brief, brief_action, End, Inbox, Life, NewDrv, Sock, Work, World};

/// A greeting at `msr` asks `peer` for the MH's connections (`follow`: the greeting
/// named us, its connections left for `peer`).
pub fn pull(w: &mut World, msr: usize, g: Greeting, peer: usize, follow: bool) {
    w.msrs[msr].rec.pulling = true;
    start(w, msr, g.clone(), peer, Some(g), follow);
}

fn start(
    w: &mut World,
    msr: usize,
    g: Greeting,
    peer: usize,
    greeter: Option<Greeting>,
    set_old: bool,
) {
    let id = w.msrs[msr].next_id;
    w.msrs[msr].next_id += 1;
    let me = w.msrs[msr].name.clone();
    let (mut m, acts) = NewSide::start(id, &me, g, w.now, w.timeouts);
    if set_old {
        m.set_old_msr(&w.msrs[peer].name.clone());
    }
    w.news.push(NewDrv {
        msr,
        m,
        chan: None,
        peer,
        greeter,
        busy: None,
        rest: Default::default(),
        inbox: Default::default(),
        next: None,
        lost: None,
        down: None,
        astray: false,
        ahead: Vec::new(),
        accepted: false,
        moved_any: false,
        life: Life::Active,
    });
    let i = w.news.len() - 1;
    w.trace_line(format!(
        "{me} new#{i} pulls from {} (handoff {id})",
        w.msrs[peer].name
    ));
    run(w, i, acts);
}

fn tag(w: &World, i: usize) -> String {
    format!("{} new#{i}", w.msrs[w.news[i].msr].name)
}

fn run(w: &mut World, i: usize, acts: Vec<Action>) {
    if w.tracing() {
        for a in &acts {
            let line = format!("{}: {}", tag(w, i), brief_action(a));
            w.trace_line(line);
        }
    }
    w.news[i].rest.extend(acts);
    resume(w, i);
}

/// Carries out the queued actions, then feeds the machine what they came to, until
/// it waits (for local work, a message or its deadline) or is done.
fn resume(w: &mut World, i: usize) {
    loop {
        if w.news[i].life != Life::Active {
            return;
        }
        while let Some(a) = w.news[i].rest.pop_front() {
            if act(w, i, a) {
                return; // Local work under way: `work_done` resumes.
            }
        }
        let now = w.now;
        let d = &mut w.news[i];
        let acts = if let Some(ev) = d.next.take() {
            d.m.handle(ev, now)
        } else if let Some(why) = d.down.take() {
            d.m.handle_old_down(&why)
        } else if let Some(why) = d.lost.take() {
            d.m.handle_channel_lost(&why)
        } else if d.m.done() {
            return finish(w, i);
        } else if d.chan.is_none() {
            d.m.handle_channel_lost("no channel")
        } else {
            match d.inbox.pop_front() {
                Some(Inbox::Msg(msg)) => feed(w, i, msg),
                Some(Inbox::Lost) => w.news[i].m.handle_channel_lost("channel closed"),
                None => return, // Waits for the channel or its deadline.
            }
        };
        if w.tracing() {
            for a in &acts {
                let line = format!("{}: {}", tag(w, i), brief_action(a));
                w.trace_line(line);
            }
        }
        w.news[i].rest.extend(acts);
    }
}

fn feed(w: &mut World, i: usize, msg: Message) -> Vec<Action> {
    let line = format!("{} <- {}", tag(w, i), brief(&msg));
    w.trace_line(line);
    let d = &mut w.news[i];
    if matches!(msg, Message::Accepted { .. }) && !d.m.holding() {
        d.accepted = true;
    }
    d.m.handle(NewEvent::Message(msg), w.now)
}

/// One action; true when it started local work (the driver awaits it).
fn act(w: &mut World, i: usize, a: Action) -> bool {
    let msr = w.news[i].msr;
    match a {
        Action::AskInstead(to) => {
            w.saw("new side asks instead (MovedOn)".into());
            let Some(p) = w.msr_index(&to) else {
                w.news[i].astray = true;
                w.news[i].lost = Some(format!("sent on to {to}, not a peer"));
                return false;
            };
            if let Some(c) = w.news[i].chan.take() {
                w.close_end(c, End::New);
            }
            w.news[i].peer = p;
        }
        Action::Send(_) if w.news[i].astray => {}
        Action::Hold(_) => {
            if !w.news[i].accepted {
                w.violate(format!(
                    "{}: holds the MH's flows before any acceptance",
                    tag(w, i)
                ));
            }
            tell(w, i, Status::Holding);
        }
        Action::Send(msg) => send(w, i, msg),
        Action::Restore(images) => {
            let d = &w.news[i];
            if let Some(g) = d.m.greeting() {
                let ts = g.ts_ms;
                let rec = &mut w.msrs[msr].rec;
                rec.last_greeting_ts = rec.last_greeting_ts.max(ts);
            }
            if w.news[i].m.token().is_some() {
                w.msrs[msr].rec.token = true;
            }
            return begin(w, i, Work::Restore(images));
        }
        Action::RestoreAhead(images) => {
            for img in images {
                let ok = restore_one(w, i, &img);
                w.news[i].ahead.push((img.id, ok));
            }
        }
        Action::Discard(ids) => {
            w.saw("new side discards restored copies".into());
            for id in &ids {
                if w.msrs[msr].socks.get(id) == Some(&Sock::Restored(i)) {
                    w.msrs[msr].socks.remove(id);
                }
            }
            w.news[i].ahead.clear();
        }
        Action::Attached => {
            w.saw("new side attached (NotHere)".into());
            tell(w, i, Status::Attached)
        }
        Action::Restart(ids) => return begin(w, i, Work::Restart(ids)),
        Action::Log(r) => {
            w.saw(format!("new side {:?}", r.outcome));
            log(w, i, r.outcome)
        }
        Action::Reroute(_)
        | Action::Unroute(_)
        | Action::Arrived { .. }
        | Action::Quarantine(_)
        | Action::Gate(_)
        | Action::Release(_) => {}
        other => {
            let t = tag(w, i);
            w.violate(format!("{t}: the driver drops {other:?}"));
        }
    }
    false
}

fn send(w: &mut World, i: usize, msg: Message) {
    let msr = w.news[i].msr;
    match w.news[i].chan {
        Some(c) => w.send(c, End::Old, msg),
        None => {
            let peer = w.news[i].peer;
            if !w.msrs[peer].up {
                // Connection refused: no msrd there.
                w.news[i].down = Some("connection refused".into());
                return;
            }
            let c = w.open_chan(msr, peer, i);
            w.news[i].chan = Some(c);
            w.send(c, End::Old, msg);
        }
    }
}

fn begin(w: &mut World, i: usize, work: Work) -> bool {
    w.news[i].busy = Some(work);
    let d = w.work_delay();
    w.after(d, super::world::Ev::NewWork { drv: i });
    true
}

/// A restore in repair mode: fails by the scenario's dice, or when the connection
/// already has a socket here (its 4-tuple is taken).
fn restore_one(w: &mut World, i: usize, img: &ConnImage) -> bool {
    let msr = w.news[i].msr;
    let taken = w.msrs[msr].socks.contains_key(&img.id);
    if taken || w.rng.chance(w.sc.faults.restore_fail) {
        return false;
    }
    w.msrs[msr].socks.insert(img.id, Sock::Restored(i));
    true
}

pub fn work_done(w: &mut World, i: usize) {
    if w.news[i].life != Life::Active {
        return; // Its msrd crashed meanwhile.
    }
    match w.news[i].busy.take() {
        Some(Work::Restore(images)) => restored(w, i, images),
        Some(Work::Restart(ids)) => restarted(w, i, ids),
        other => panic!("new side awaited {other:?}"),
    }
    resume(w, i);
}

fn restored(w: &mut World, i: usize, images: Vec<ConnImage>) {
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    for img in &images {
        if restore_one(w, i, img) {
            ok.push(img.id);
        } else {
            failed.push((img.id, "restore failed".to_string()));
        }
    }
    for (id, restored) in std::mem::take(&mut w.news[i].ahead) {
        if restored {
            ok.push(id);
        } else {
            failed.push((id, "restore failed".to_string()));
        }
    }
    // The daemon reads the channel once, without waiting, before the restart: a
    // call-off heard now discards the copies. What the machine answers is dropped.
    if let Some(Inbox::Msg(_)) = w.news[i].inbox.front() {
        let Some(Inbox::Msg(msg)) = w.news[i].inbox.pop_front() else {
            unreachable!()
        };
        let ignored = feed(w, i, msg);
        if !ignored.is_empty() {
            let t = tag(w, i);
            w.violate(format!(
                "{t}: the driver drops the machine's answer {ignored:?}"
            ));
        }
    }
    w.news[i].next = Some(NewEvent::Restored {
        restored: ok,
        failed,
    });
}

fn restarted(w: &mut World, i: usize, ids: Vec<u64>) {
    let msr = w.news[i].msr;
    let chan = w.news[i].chan;
    let (mut resumed, mut failed) = (Vec::new(), Vec::new());
    for id in ids {
        if w.msrs[msr].socks.get(&id) != Some(&Sock::Restored(i)) {
            failed.push((id, "not restored here".to_string()));
            continue;
        }
        if w.rng.chance(w.sc.faults.restart_fail) {
            w.msrs[msr].socks.remove(&id);
            failed.push((id, "restart failed".to_string()));
            continue;
        }
        w.msrs[msr].socks.insert(id, Sock::Running);
        let t = w.conns.get_mut(&id).expect("known");
        t.orphaned = false;
        if let Some(c) = chan {
            t.started.insert(c);
            if w.chans[c].new_heard_loss {
                t.started_after_loss.insert(c);
            }
        }
        resumed.push(id);
        super::check::started_running(w, id);
    }
    w.news[i].next = Some(NewEvent::Restarted { resumed, failed });
}

fn log(w: &mut World, i: usize, outcome: Outcome) {
    let ok = matches!(outcome, Outcome::Moved | Outcome::Partial);
    w.news[i].moved_any = ok;
    let (msr, peer) = (w.news[i].msr, w.news[i].peer);
    if ok {
        let from = w.msrs[peer].name.clone();
        let rec = &mut w.msrs[msr].rec;
        rec.came_from = Some(from);
        rec.moved_to = None;
    }
    let status = match outcome {
        _ if ok => Status::Moved,
        Outcome::OldDown => Status::Attached,
        _ => Status::Failed,
    };
    tell(w, i, status);
}

/// Answers the MH that greeted us (pulls of `also_at` have no greeter).
fn tell(w: &mut World, i: usize, status: Status) {
    if let Some(g) = w.news[i].greeter.clone() {
        let msr = w.news[i].msr;
        reply(w, msr, &g.nonce, status);
    }
}

/// The handoff is over: keep the channel to answer a late call-off if we
/// acknowledged, pull what `also_at` names, and let the MH pull again.
fn finish(w: &mut World, i: usize) {
    let msr = w.news[i].msr;
    let left: Vec<u64> = w.msrs[msr]
        .socks
        .iter()
        .filter(|(_, s)| **s == Sock::Restored(i))
        .map(|(c, _)| *c)
        .collect();
    if !left.is_empty() {
        let t = tag(w, i);
        w.violate(format!(
            "{t}: restored copies {left:?} neither restarted nor discarded"
        ));
    }
    let d = &mut w.news[i];
    match (d.m.acknowledged(), d.chan) {
        (true, Some(_)) => {
            d.life = Life::Answering {
                until: w.now + CALL_OFF_WAIT_US,
            };
            drain_answers(w, i);
        }
        (_, c) => {
            d.life = Life::Finished;
            if let Some(c) = c {
                w.close_end(c, End::New);
            }
        }
    }
    let d = &w.news[i];
    let more = d.m.also_at().filter(|_| d.moved_any).map(str::to_string);
    let g = d.m.greeting().cloned();
    match (more.and_then(|at| w.msr_index(&at)), g) {
        (Some(p), Some(g)) => {
            let t = tag(w, i);
            w.trace_line(format!(
                "{t}: the MH's other connections are at {}",
                w.msrs[p].name
            ));
            w.saw("also_at pull".into());
            start(w, msr, g, p, None, true);
        }
        _ => w.msrs[msr].rec.pulling = false,
    }
}

/// What reaches the new side's end of the channel.
pub fn receive(w: &mut World, i: usize, item: Inbox) {
    match w.news[i].life {
        Life::Finished => {}
        Life::Answering { .. } => {
            w.news[i].inbox.push_back(item);
            drain_answers(w, i);
        }
        Life::Active => {
            w.news[i].inbox.push_back(item);
            if w.news[i].busy.is_none() {
                resume(w, i);
            }
        }
    }
}

/// `answer_call_off`: a call-off after our acknowledgement is answered with it again.
fn drain_answers(w: &mut World, i: usize) {
    while let Some(item) = w.news[i].inbox.pop_front() {
        let Inbox::Msg(msg) = item else {
            return end_answering(w, i);
        };
        for a in feed(w, i, msg) {
            if let Action::Send(m) = a {
                w.saw("late call-off answered with the acknowledgement".into());
                let c = w.news[i].chan.expect("a channel");
                w.send(c, End::Old, m);
            }
        }
    }
}

fn end_answering(w: &mut World, i: usize) {
    w.news[i].life = Life::Finished;
    if let Some(c) = w.news[i].chan {
        w.close_end(c, End::New);
    }
}

/// The machine's deadline (or the answerer's) passed.
pub fn timeout(w: &mut World, i: usize) {
    if let Life::Answering { .. } = w.news[i].life {
        return end_answering(w, i);
    }
    let t = tag(w, i);
    w.trace_line(format!("{t}: deadline"));
    let acts = w.news[i].m.handle_timeout(w.now);
    run(w, i, acts);
}
