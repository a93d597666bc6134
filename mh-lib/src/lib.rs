//! `itcp-mh`: the mobile host's library — I-TCP connect/listen/accept/close wrappers,
//! MSR discovery and the mobility agent.
//!
//! Not built yet: issues 3 and 4 fill this crate. It deliberately exports nothing until then.
