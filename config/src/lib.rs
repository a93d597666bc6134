//! `itcp-config`: the TOML schema shared by `msrd`, `itcpctl` and `mh-lib`, with
//! validation that names the file, the key and what is wrong.
//!
//! Not built yet: issue 3 fills this crate. It deliberately exports nothing until then.
