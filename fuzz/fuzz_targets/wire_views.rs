#![no_main]
// Body shared with the stable smoke test: itcp_wire::fuzzing::views.
libfuzzer_sys::fuzz_target!(|data: &[u8]| itcp_wire::fuzzing::views(data));
