//! `itcp-proxy`: the `msrd` daemon (split connections, relay engine, wireless-side
//! tuning, interception rules, beacons) and the `itcpctl` operator CLI.
//!
//! Not built yet: issue 3 (relay) and issue 4 (handoff) fill this crate. Until then it
//! deliberately exports nothing, so nothing can be mistaken for a working daemon.
