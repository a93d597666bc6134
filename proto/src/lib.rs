//! `itcp-proto`: the wire formats that the mobile host and the MSRs speak, with no I/O
//! (docs/architecture.md §2; smoltcp's `wire/` is the model). Both `msrd` and `mh-lib` depend on
//! this crate and never on each other, so an app linking mh-lib links no TCP_REPAIR
//! code.
//!
//! | module | format | between |
//! |---|---|---|
//! | [`socks`] | SOCKS5 + I-TCP extensions (token, LISTEN/ACCEPT) | MH ⇄ MSR, TCP |
//! | [`token_kx`] | the token sealed under an X25519 key agreement | MH ⇄ MSR, TCP |
//! | [`beacon`] | MSR advertisement; MH solicitation of one | MSR → cell, MH → cell, UDP |
//! | [`greeting`] | greeting with proof, reply | MH ⇄ MSR, UDP |
//! | [`channel`] | authenticated frames carrying handoff messages and images | MSR ⇄ MSR, TCP |
//! | [`control`] | operator requests and replies (JSON lines) | msrd ⇄ `itcpctl`, Unix socket |
//! | [`hex`] | hex text of tokens, nonces, proofs | — |
//!
//! Every parser takes bytes and returns a value or an error that says what was wrong;
//! none panics on any input (fuzzed: `fuzz/`).

pub mod beacon;
pub mod channel;
pub mod control;
#[doc(hidden)]
pub mod fuzzing;
pub mod greeting;
pub mod hex;
pub mod socks;
pub mod token_kx;
