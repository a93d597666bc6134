#![no_main]
// Body shared with the stable smoke test: itcp_proto::fuzzing::greeting.
libfuzzer_sys::fuzz_target!(|data: &[u8]| itcp_proto::fuzzing::greeting(data));
