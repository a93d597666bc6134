//! `itcp-proxy`: `msrd`, the I-TCP mobility support router daemon, and `itcpctl`.
//!
//! An MH's TCP interaction with a fixed host (FH) becomes two connections with the MSR
//! in the middle: the fixed side impersonates the MH (transparent sockets), the
//! wireless side is tuned for the wireless link. Modules, each with one job:
//!
//! * [`daemon`] — listeners, the request protocol (docs/protocol.md), transparent
//!   interception, drain on SIGTERM;
//! * [`relay`] / [`splice`] — moving bytes between the two halves, zero-copy;
//!   [`urgent`] — urgent data (MSG_OOB) passed on out of band;
//! * [`fixed`] — sockets that impersonate the MH; [`listeners`] — passive opens;
//! * [`intercept`] — msrd's nftables table and policy route;
//! * [`admission`] — MH prefixes, connection limits, accept rate;
//! * [`sessions`] / [`control`] — the session table, statistics and the operator socket;
//! * [`metrics`] / [`http`] — Prometheus metrics and the status page (`[metrics]`);
//! * [`beacon`] — advertisements on the cells;
//! * [`sockopt`], [`cells`], [`logging`] — socket options, per-cell tuning, logs;
//! * [`heap`] — memory freed by a crowd of closed connections back to the system;
//! * [`capabilities`] — the few capabilities msrd keeps, everything else dropped at
//!   start;
//! * [`footprint`] — everything msrd changes on the router, undone at exit and after
//!   a crash.
//!
//! * [`handoff`] — moving an MH's connections between MSRs (greetings, the MSR⇄MSR
//!   channel, freeze/capture/restore), with [`netlink`] for holds and ARP takeover.
//! * [`handshakes`] — TCP handshakes half-open when their MH moves on, completed so
//!   that they move too (SYN-ACKs reported over [`nflog`]).
//! * [`detect`] — network detection: MHs arriving in a cell, reported by msrd's own
//!   rules over [`nflog`], pull their connections with no greeting.
//! * [`upgrade`] — replacing msrd by a new process of its binary, every connection
//!   handed over; [`notify`] — systemd's readiness protocol.
//! * [`faults`] — the test hooks the end-to-end tests inject (`MSRD_FAULT`).
pub mod admission;
pub mod beacon;
pub(crate) mod bindings;
pub mod capabilities;
pub mod cells;
pub mod clock;
pub mod control;
pub mod daemon;
pub(crate) mod departed;
pub mod detect;
pub mod faults;
pub mod fixed;
pub mod footprint;
pub mod handoff;
pub mod handshakes;
pub mod heap;
pub mod holding;
pub mod hostapd;
pub mod http;
pub mod intercept;
pub mod listeners;
pub mod logging;
pub mod metrics;
pub mod netlink;
pub mod nflog;
pub mod notify;
pub mod random;
pub mod relay;
pub mod run;
pub mod sessions;
pub mod setup;
pub(crate) mod sizing;
pub mod sockdiag;
pub mod sockopt;
pub mod splice;
pub mod strays;
pub mod upgrade;
pub mod urgent;
