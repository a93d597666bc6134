//! Stable smoke run of the config fuzz targets (`fuzz/`, cargo-fuzz on nightly): the
//! same entry points over the committed corpora and a few thousand deterministic
//! mutations, checking no panic and bounded time per input.

#[path = "../../fuzz/entry/smoke.rs"]
mod smoke;

#[test]
fn config_msrd() {
    smoke::run("config_msrd", itcp_config::fuzzing::config_msrd);
}

#[test]
fn config_mh() {
    smoke::run("config_mh", itcp_config::fuzzing::config_mh);
}
