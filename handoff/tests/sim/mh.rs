//! The MH: which cells it hears, its agent's greetings (retransmitted, answered or
//! lost on the air), the connections it opens; and each MSR's greeting server, which
//! decides with the real `itcp_handoff::greet::decide` and starts pulls.

use itcp_handoff::greet::{self, Context, Decision, MhView};
use itcp_proto::greeting::Greeting;

use super::world::{mh_addr, Ev, Sock, World, MS, TOKEN};

/// What an MSR answers a greeting (`GreetStatus`, as far as the agent cares).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Holding,
    Attached,
    Moved,
    Failed,
    Refused,
}

#[derive(Debug, Clone)]
struct Pending {
    to: usize,
    g: Greeting,
    tries: u32,
    holding: bool,
}

/// The MH's agent.
#[derive(Debug)]
pub struct Agent {
    pub cells: Vec<usize>,
    /// The MSR that last answered `attached` or `moved`: named as previous.
    pub at: usize,
    ts: u64,
    pending: Option<Pending>,
    /// Moves tried again after `failed` since the MH last entered a cell.
    retries: u32,
    last_sent: Option<(usize, Greeting)>,
}

impl Agent {
    pub fn new() -> Agent {
        Agent {
            cells: vec![0],
            at: 0,
            ts: 1000,
            pending: None,
            retries: 0,
            last_sent: None,
        }
    }

    pub fn msr_crashed(&mut self, _m: usize) {}
}

const RETRY_US: u64 = 300 * MS;
const TRIES: u32 = 4;
const MAX_RETRIES: u32 = 2;

/// The MH now hears `cells`: it greets each cell it enters.
pub fn cells(w: &mut World, cells: Vec<usize>) {
    w.trace_line(format!("MH hears cells {cells:?}"));
    let entered: Vec<usize> = cells
        .iter()
        .copied()
        .filter(|c| !w.mh.cells.contains(c))
        .collect();
    if let Some(p) = &w.mh.pending {
        if !cells.contains(&p.to) {
            w.mh.pending = None;
        }
    }
    w.mh.cells = cells;
    if !entered.is_empty() {
        w.mh.retries = 0;
    }
    for c in entered {
        greet(w, c);
    }
}

fn greet(w: &mut World, to: usize) {
    w.mh.ts += 10;
    let prev = w.msrs[w.mh.at].name.clone();
    let g = Greeting::new(
        TOKEN,
        mh_addr(),
        &prev,
        &w.msrs[to].name.clone(),
        w.mh.ts,
        w.rng.bytes16(),
    );
    w.trace_line(format!(
        "MH greets {} naming {prev} (ts {})",
        w.msrs[to].name, g.ts_ms
    ));
    w.mh.pending = Some(Pending {
        to,
        g: g.clone(),
        tries: 1,
        holding: false,
    });
    w.mh.last_sent = Some((to, g.clone()));
    w.after(
        RETRY_US,
        Ev::Regreet {
            nonce: g.nonce.clone(),
        },
    );
    air_to_msr(w, to, g);
}

fn air_to_msr(w: &mut World, to: usize, g: Greeting) {
    if w.rng.chance(w.sc.faults.radio_loss) {
        return w.trace_line("  greeting lost on the air".into());
    }
    let d = w.rng.range(500, 20 * MS);
    w.after(d, Ev::Greeting { msr: to, g });
}

/// A move that failed is tried again if the MH is still in that cell, attached
/// elsewhere, and greeting nobody else.
pub fn retry(w: &mut World, to: usize) {
    if w.mh.cells.contains(&to) && w.mh.at != to && w.mh.pending.is_none() {
        greet(w, to);
    }
}

/// No final answer yet: the agent sends the same greeting again.
pub fn regreet(w: &mut World, nonce: &str) {
    let Some(p) = w.mh.pending.as_mut() else {
        return;
    };
    if p.g.nonce != nonce || p.holding || p.tries >= TRIES {
        return;
    }
    p.tries += 1;
    let (to, g) = (p.to, p.g.clone());
    w.after(
        RETRY_US,
        Ev::Regreet {
            nonce: nonce.into(),
        },
    );
    air_to_msr(w, to, g);
}

/// An MSR answers the MH, which hears it while in that MSR's cell.
pub fn reply(w: &mut World, from: usize, nonce: &str, status: Status) {
    let rec = &mut w.msrs[from].rec;
    rec.last_nonce = Some(nonce.into());
    rec.last_reply = Some(status);
    if w.rng.chance(w.sc.faults.radio_loss) {
        return w.trace_line(format!("  answer {status:?} lost on the air"));
    }
    let d = w.rng.range(500, 20 * MS);
    w.after(d, Ev::Answer { from, status });
}

pub fn answer(w: &mut World, from: usize, status: Status) {
    if !w.mh.cells.contains(&from) {
        return;
    }
    w.trace_line(format!("MH hears {status:?} from {}", w.msrs[from].name));
    match status {
        Status::Holding => {
            if let Some(p) = w.mh.pending.as_mut().filter(|p| p.to == from) {
                p.holding = true;
            }
        }
        Status::Attached | Status::Moved => {
            w.mh.at = from;
            w.mh.pending = None;
        }
        Status::Failed | Status::Refused => {
            if w.mh.pending.as_ref().is_some_and(|p| p.to == from) {
                w.mh.pending = None;
                if status == Status::Failed && w.mh.retries < MAX_RETRIES {
                    // The agent tries the move again a little later, with a new greeting.
                    w.mh.retries += 1;
                    let d = w.rng.range(200 * MS, 2000 * MS);
                    w.after(d, Ev::Retry { to: from });
                }
            }
        }
    }
}

/// A greeting reaches msrd's greeting server at `msr`.
pub fn greeting_at(w: &mut World, msr: usize, g: Greeting) {
    if !w.msrs[msr].up {
        return;
    }
    let m = &w.msrs[msr];
    let local = m
        .socks
        .values()
        .filter(|s| !matches!(s, Sock::Restored(_)))
        .count();
    let frozen = m.socks.values().any(|s| matches!(s, Sock::Frozen(_)));
    let view = MhView {
        token: m.rec.token.then_some(TOKEN),
        local,
        frozen,
        pulling: m.rec.pulling,
        last_greeting_ts: m.rec.last_greeting_ts,
        last_nonce: m.rec.last_nonce.as_deref(),
        moved_to: m.rec.moved_to.as_deref(),
    };
    let cx = Context {
        me: &m.name,
        from_mh: true,
        is_mh: true,
        prev_is_peer: g.prev_msr != m.name && w.msr_index(&g.prev_msr).is_some(),
        pull_allowed: true,
    };
    let d = greet::decide(&g, cx, view);
    let kind = format!("greeting: {d:?}");
    w.saw(
        kind.split(['(', ' ', '{'])
            .take(2)
            .collect::<Vec<_>>()
            .join(" "),
    );
    w.trace_line(format!(
        "{} decides {d:?} on greeting ts {}",
        w.msrs[msr].name, g.ts_ms
    ));
    match d {
        Decision::Ignore | Decision::Drop(_) | Decision::Defer => {}
        Decision::Repeat => {
            if let Some(s) = w.msrs[msr].rec.last_reply {
                reply(w, msr, &g.nonce, s);
            }
        }
        Decision::Refuse(_) => reply(w, msr, &g.nonce, Status::Refused),
        Decision::Attach { proven } => {
            if proven {
                let rec = &mut w.msrs[msr].rec;
                rec.last_greeting_ts = rec.last_greeting_ts.max(g.ts_ms);
            }
            reply(w, msr, &g.nonce, Status::Attached);
        }
        Decision::Pull => {
            let peer = w.msr_index(&g.prev_msr).expect("a peer");
            super::new_msr::pull(w, msr, g, peer, false);
        }
        Decision::Follow(at) => {
            let peer = w.msr_index(&at).expect("a peer");
            super::new_msr::pull(w, msr, g, peer, true);
        }
    }
}

/// The MH opens a connection through the MSR it is attached to, if it is there and
/// no handoff of the MH is under way there (SYNs are held meanwhile).
pub fn open(w: &mut World) {
    let at = w.mh.at;
    let m = &w.msrs[at];
    let busy = m.rec.pulling || m.socks.values().any(|s| !matches!(s, Sock::Running));
    if m.up && w.mh.cells.contains(&at) && !busy {
        w.open_at(at);
    }
}

/// The MH's last greeting again, later (a copy from the air, or an attacker's replay).
pub fn replay(w: &mut World) {
    if let Some((to, g)) = w.mh.last_sent.clone() {
        w.trace_line(format!(
            "replay of greeting ts {} to {}",
            g.ts_ms, w.msrs[to].name
        ));
        air_to_msr(w, to, g);
    }
}

/// A greeting for the MH under a token that is not its own.
pub fn forge(w: &mut World, to: usize) {
    let prev = w.msrs[w.mh.at].name.clone();
    let g = Greeting::new(
        b"not the MH's token",
        mh_addr(),
        &prev,
        &w.msrs[to].name.clone(),
        w.mh.ts + 5,
        w.rng.bytes16(),
    );
    w.trace_line(format!(
        "forged greeting to {} naming {prev}",
        w.msrs[to].name
    ));
    let d = w.rng.range(500, 20 * MS);
    w.after(d, Ev::Greeting { msr: to, g });
}
