//! Fuzz entry points of config loading, shared by the cargo-fuzz targets
//! `fuzz/fuzz_targets/config_{msrd,mh}.rs` and the stable smoke test
//! `tests/fuzz_smoke.rs`. Not part of the crate's API (`#[doc(hidden)]`).

use crate::{ConfigError, MhConfig, MsrdConfig};

/// Everything an operator sees of an error, so formatting is exercised too.
fn describe(e: &ConfigError) -> String {
    format!(
        "{e} {:?} {:?} {:?} {:?} {}",
        e.kind(),
        e.key(),
        e.position(),
        e.origin(),
        e.message()
    )
}

/// `MsrdConfig::from_str` on the text (non-UTF-8 input is what `load` rejects before
/// parsing); a loaded config answers its helpers.
pub fn config_msrd(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match MsrdConfig::from_str(text, "fuzz.toml") {
        Ok(c) => {
            let _ = (
                c.msr.socks_addrs(),
                c.beacon_interfaces(),
                c.wireless_tuning_for(Some("wl0")),
            );
            for p in &c.handoff.peers {
                if p.key.is_some() {
                    // Validated keys parse; key_file is never read here.
                    p.key_bytes().expect("a validated key parses");
                }
            }
        }
        Err(e) => {
            let _ = describe(&e);
        }
    }
}

/// `MhConfig::from_str` on the text.
pub fn config_mh(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match MhConfig::from_str(text, "fuzz.toml") {
        Ok(c) => {
            let _ = (c.mh.connect_timeout(), c.mobility.hysteresis());
        }
        Err(e) => {
            let _ = describe(&e);
        }
    }
}
