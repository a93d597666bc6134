#![no_main]
// Body shared with the stable smoke test: itcp_config::fuzzing::config_msrd.
libfuzzer_sys::fuzz_target!(|data: &[u8]| itcp_config::fuzzing::config_msrd(data));
