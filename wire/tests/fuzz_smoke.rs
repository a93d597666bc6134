//! Stable smoke run of the `wire_views` fuzz target (`fuzz/`, cargo-fuzz on nightly):
//! the same entry point over the committed corpus and a few thousand deterministic
//! mutations, checking no panic and bounded time per input.

#[path = "../../fuzz/entry/smoke.rs"]
mod smoke;

#[test]
fn wire_views() {
    smoke::run("wire_views", itcp_wire::fuzzing::views);
}
