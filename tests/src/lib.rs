//! `itcp-testbed`: the emulated mobile network every end-to-end test and benchmark of
//! I-TCP runs on.
//!
//! * [`lab`] builds the topology of docs/architecture.md §1 out of network namespaces and tears it
//!   down again (also on panic, SIGINT/SIGTERM, or — via a sweep — after SIGKILL).
//! * [`emu`] is the sans-IO core of the `airlink` link emulator: link directions with
//!   rate, delay, drop-tail queue, seeded loss and delivery traces, and the air
//!   (cells, association, handoff schedules). The `airlink` binary wraps it with TAP
//!   devices and a precise timer.
//! * [`stream`] and [`ttcp`] are the traffic tool: a seeded byte stream verified at the
//!   receiver, with goodput, a 100 ms timeline and the longest stall.
//! * [`scenario`] runs a transfer on a lab under a handoff schedule; [`baseline`] is the
//!   regular-TCP (Mobile-IP-like rerouting) mode.
//! * [`handoff_bench`] measures handoff latency and the gap at the MH; [`paper`] runs
//!   the paper's experiments and writes `docs/results.md` (plots via [`svg`]).
//! * [`msrd_user`] runs msrd as an unprivileged user with ambient capabilities, as its
//!   systemd unit does (`ITCP_LAB_MSRD_USER`).
//! * [`soak`] is the chaos soak: several MHs, random moves and injected faults, every
//!   byte verified, RSTs attributed, msrd's state compared at start and end.
pub mod baseline;
pub mod bench;
pub mod closes;
pub mod dna;
pub mod emu;
pub mod firstbyte;
pub mod handoff_bench;
pub mod lab;
pub mod moves;
pub mod msrd_user;
pub mod paper;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod soak;
pub mod stream;
pub mod svg;
pub mod sys;
pub mod ttcp;
pub mod upload;
pub mod wireless;
