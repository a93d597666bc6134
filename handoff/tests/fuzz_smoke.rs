//! Stable smoke run of the `image_decode` fuzz target (`fuzz/`, cargo-fuzz on nightly):
//! the same entry point over the committed corpus and a few thousand deterministic
//! mutations, checking no panic and bounded time per input.

#[path = "../../fuzz/entry/smoke.rs"]
mod smoke;

#[test]
fn image_decode() {
    smoke::run("image_decode", itcp_handoff::fuzzing::image_decode);
}
