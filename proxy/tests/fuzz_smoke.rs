//! Stable smoke run of the `control_request` fuzz target (`fuzz/`, cargo-fuzz on
//! nightly): the same entry point over the committed corpus and a few thousand
//! deterministic mutations, checking no panic and bounded time per input.

#[path = "../../fuzz/entry/smoke.rs"]
mod smoke;

#[path = "../../fuzz/entry/control_request.rs"]
mod entry;

#[test]
fn control_request() {
    smoke::run("control_request", entry::control_request);
}
