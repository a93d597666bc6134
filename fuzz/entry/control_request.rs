//! Fuzz entry point of msrd's control socket requests, shared (by `#[path]`) between
//! `fuzz/fuzz_targets/control_request.rs` and the stable smoke test
//! `proxy/tests/fuzz_smoke.rs`: the proxy crate keeps no fuzzing code of its own.

use itcp_proxy::control::{answer, parse_request};
use itcp_proxy::sessions::Sessions;

/// One request line as `serve` hands it over (UTF-8, trimmed): parsing never panics,
/// and the answer is `ok` exactly when the request parsed.
pub fn control_request(data: &[u8]) {
    let Ok(line) = std::str::from_utf8(data) else {
        return; // serve's line reader ends the connection on non-UTF-8 input
    };
    let line = line.trim();
    let parsed = parse_request(line);
    let reply = answer(&Sessions::default(), "fuzz", line);
    assert_eq!(reply["ok"].as_bool(), Some(parsed.is_ok()), "{reply}");
    serde_json::to_vec(&reply).expect("answers serialize");
}
