//! Stable smoke run of the fuzz targets of this crate (`fuzz/`, cargo-fuzz on nightly):
//! the same entry points over the committed corpora and a few thousand deterministic
//! mutations, checking no panic and bounded time per input.

#[path = "../../fuzz/entry/smoke.rs"]
mod smoke;

use itcp_proto::fuzzing;

#[test]
fn socks_server() {
    smoke::run("socks_server", fuzzing::socks_server);
}

#[test]
fn socks_client() {
    smoke::run("socks_client", fuzzing::socks_client);
}

#[test]
fn beacon() {
    smoke::run("beacon", fuzzing::beacon);
}

#[test]
fn greeting() {
    smoke::run("greeting", fuzzing::greeting);
}

#[test]
fn channel_frame() {
    smoke::run("channel_frame", fuzzing::channel_frame);
}
