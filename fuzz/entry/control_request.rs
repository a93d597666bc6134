//! Fuzz entry point of msrd's control socket requests, shared (by `#[path]`) between
//! `fuzz/fuzz_targets/control_request.rs` and the stable smoke test
//! `proxy/tests/fuzz_smoke.rs`: the proxy crate keeps no fuzzing code of its own.

use itcp_proto::control::{Reply, Request};
use itcp_proxy::control::answer_line;
use itcp_proxy::sessions::Sessions;

/// One request line as `serve` hands it over (UTF-8, trimmed): parsing never panics,
/// the answer is an error exactly when the request did not parse (or is an `upgrade`,
/// which only the daemon's main loop serves), and every answer serializes to a line
/// that parses back.
pub fn control_request(data: &[u8]) {
    let Ok(line) = std::str::from_utf8(data) else {
        return; // serve's line reader ends the connection on non-UTF-8 input
    };
    let line = line.trim();
    let parsed = Request::parse(line);
    let reply = answer_line(&Sessions::default(), "fuzz", line);
    let text = reply.to_line();
    let served = parsed.is_ok_and(|r| r != Request::Upgrade);
    assert_eq!(reply.into_result().is_ok(), served, "{text}");
    Reply::parse(text.trim()).expect("answers parse back");
}
