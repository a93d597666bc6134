#![no_main]
// Body shared with the stable smoke test proxy/tests/fuzz_smoke.rs.
#[path = "../entry/control_request.rs"]
mod entry;

libfuzzer_sys::fuzz_target!(|data: &[u8]| entry::control_request(data));
