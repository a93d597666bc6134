//! The gate on an MH's restored connections at the new MSR (`Action::Gate`): from
//! the release of the MH's hold until the restart is over, its inbound TCP gets
//! through only on flows that restarted here. A socket still in repair mode takes
//! and acknowledges what it is sent; had its restart then failed, those bytes would
//! be lost. What the gate stops is held (`crate::holding`): a restarted connection's
//! segments go to its socket, the others are dropped once the restart is over.
//!
//! A restarted connection's flows are *marked* running for a while ([`MARK_TTL`])
//! and the mark is left to expire: the kernel deletes a set element at a far higher
//! cost than it adds one (tens of ms now and then, against ~100 µs for an add of 64).
//! The only marks ever deleted are those still live when the same flows are
//! restored here again (the MH came back within the TTL): those are remembered here,
//! as are the flows dropped here because their connections live at another MSR
//! (`Gates::drop_elsewhere`) or closed there (`Gates::drop_closed`), which a restore
//! here lets through again.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::warn;

use crate::intercept::Rules;

/// How long a running mark lasts: longer than the restart of an MH's connections
/// usually takes (~0.2 s for 1000 with full queues here; a gate that outlives its
/// marks only delays segments until the restart is over), and short enough that an
/// MH moving back and forth seldom finds its old marks still live.
pub const MARK_TTL: Duration = Duration::from_secs(1);

/// A flow as (MH's end, other end).
type Flow = (SocketAddr, SocketAddr);

#[derive(Default)]
pub struct Gates {
    /// Flows marked running, and until when the kernel may still hold the mark.
    marked: Mutex<HashMap<Flow, Instant>>,
    /// Flows of connections that live at another MSR, dropped here silently (strays
    /// sets), and until when.
    dropped: Mutex<HashMap<Flow, Instant>>,
    /// Flows that closed at another MSR, dropped here (closed sets), and until when.
    closed: Mutex<HashMap<Flow, Instant>>,
}

/// Takes out of `map` (and returns) those of `flows` still live in it.
fn take_live(map: &Mutex<HashMap<Flow, Instant>>, flows: &[Flow]) -> Vec<Flow> {
    let mut m = map.lock().unwrap();
    let now = Instant::now();
    m.retain(|_, until| *until > now);
    flows
        .iter()
        .filter(|f| m.remove(f).is_some())
        .copied()
        .collect()
}

/// Notes in `map` that the kernel holds `flows` for `ttl`. Its timers started before
/// now: never forgotten here while the kernel still has them (the margin is for its
/// clock's granularity).
fn remember(map: &Mutex<HashMap<Flow, Instant>>, flows: &[Flow], ttl: Duration) {
    let until = Instant::now() + ttl + Duration::from_millis(20);
    let mut m = map.lock().unwrap();
    for f in flows {
        m.insert(*f, until);
    }
}

impl Gates {
    /// Gates `mh`'s inbound TCP; `flows` (its restored connections') start unmarked
    /// and no longer dropped as another MSR's.
    pub fn close(&self, rules: &Rules, mh: IpAddr, flows: &[Flow]) -> io::Result<()> {
        let stale = take_live(&self.marked, flows);
        if !stale.is_empty() {
            rules.unmark_running(&stale)?;
        }
        let back = take_live(&self.dropped, flows);
        if !back.is_empty() {
            rules.undrop_strays(&back)?;
        }
        // The MH's kernel reuses ports: a connection opened elsewhere on the 4-tuple of
        // one that closed lately comes here, where that closed flow is still dropped.
        let reused = take_live(&self.closed, flows);
        if !reused.is_empty() {
            rules.undrop_closed(&reused)?;
        }
        rules.gate(mh, true)
    }

    /// Drops the segments of `flows` that closed at another MSR, each for what is
    /// left of its window (see [`Rules::drop_closed`]), unless a connection restored
    /// here meanwhile uses the 4-tuple again.
    pub fn drop_closed(
        &self,
        rules: &Rules,
        flows: &[(SocketAddr, SocketAddr, Duration)],
    ) -> io::Result<()> {
        if flows.is_empty() {
            return Ok(());
        }
        rules.drop_closed(flows)?;
        let now = Instant::now();
        let mut m = self.closed.lock().unwrap();
        m.retain(|_, until| *until > now);
        for &(a, z, ttl) in flows {
            m.insert((a, z), now + ttl + Duration::from_millis(20));
        }
        Ok(())
    }

    /// Drops the segments of `flows`, connections that live at another MSR now, for
    /// `ttl` (never answered with RST here), unless they are restored here meanwhile.
    pub fn drop_elsewhere(&self, rules: &Rules, flows: &[Flow], ttl: Duration) -> io::Result<()> {
        if flows.is_empty() || ttl.is_zero() {
            return Ok(());
        }
        let timed: Vec<_> = flows.iter().map(|&(a, z)| (a, z, ttl)).collect();
        rules.drop_strays(&timed)?;
        remember(&self.dropped, flows, ttl);
        Ok(())
    }

    /// Lets the segments of `flows` (restarted connections') through the gate.
    pub fn mark(&self, rules: &Rules, flows: &[Flow]) {
        if flows.is_empty() {
            return;
        }
        if let Err(e) = rules.mark_running(flows, MARK_TTL) {
            // They run; their segments come through once the gate is lifted.
            warn!(flows = flows.len(), error = %e, "restarted connections not let through the gate");
            return;
        }
        remember(&self.marked, flows, MARK_TTL);
    }

    /// Lifts `mh`'s gate (the restart is over).
    pub fn open(&self, rules: &Rules, mh: IpAddr) {
        if let Err(e) = rules.gate(mh, false) {
            warn!(%mh, error = %e, "gate not lifted: the MH's TCP stays held, then dropped, here");
        }
    }
}
