//! A deterministic simulation of two or three MSRs handing an MH's connections over
//! with the real sans-IO machines of `itcp_handoff::machine` (quinn-proto's `Pair`
//! idea): simulated time, channel, air, sockets and crashes; invariants after every
//! step. See docs/testing.md ("The handoff simulation").

pub mod check;
pub mod mh;
pub mod new_msr;
pub mod old_msr;
pub mod rng;
pub mod scenario;
pub mod world;

pub use itcp_handoff::machine::Action;

/// A deliberately broken driver, to show the invariants catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    None,
    /// The old MSR deletes its frozen copies as it sends their images, before any
    /// acknowledgement.
    DeleteBeforeAck,
    /// The old MSR serves on at the acknowledgement's deadline instead of awaiting
    /// the new MSR's answer to its call-off (before the soak's seed 43 fix).
    UnfreezeAtCallOff,
}

/// What one seed came to.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub violation: Option<String>,
    pub hazards: [u32; 2],
    pub steps: u64,
    pub trace: Vec<String>,
    pub seen: std::collections::BTreeMap<String, u64>,
}

pub fn run_seed(seed: u64, mutation: Mutation, trace: bool) -> Report {
    let mut w = world::World::new(seed, mutation, trace);
    w.run();
    Report {
        seed,
        violation: w.violation.take(),
        hazards: w.hazards,
        steps: w.steps,
        trace: w.trace.take().unwrap_or_default(),
        seen: std::mem::take(&mut w.seen),
    }
}
