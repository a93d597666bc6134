#![no_main]
// Body shared with the stable smoke test: itcp_handoff::fuzzing::image_decode.
libfuzzer_sys::fuzz_target!(|data: &[u8]| itcp_handoff::fuzzing::image_decode(data));
