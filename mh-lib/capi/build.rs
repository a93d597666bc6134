//! Gives libitcp.so a SONAME (`libitcp.so.MAJOR`) and versions its symbols with it, so
//! that programs linked against it record the ABI they were built for and a packaged
//! library can be upgraded next to an incompatible one; and links `libitcp.so.MAJOR` to
//! it in the profile directory, so that programs linked with `-L target/release -litcp`
//! find it there at run time.

use std::path::PathBuf;

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    let soname = format!("libitcp.so.{major}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    // Symbol versions named after the SONAME on every exported function. rustc hands
    // the linker an unversioned script listing the exports; GNU ld versions those with
    // --default-symver, rust-lld has no such flag and ignores a second, tagged script
    // for names the first lists exactly. So this library links with GNU ld.
    println!("cargo:rustc-cdylib-link-arg=-fuse-ld=bfd");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--default-symver");
    println!("cargo:rerun-if-changed=build.rs");
    // OUT_DIR is <profile>/build/<crate>-<hash>/out: the library lands in <profile>
    // (built as a package of its own) or <profile>/deps (as a dependency).
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    if let Some(profile) = out.ancestors().nth(3) {
        for dir in [profile.to_path_buf(), profile.join("deps")] {
            let link = dir.join(&soname);
            if link.symlink_metadata().is_err() {
                // Dangles until cargo links the library next to it; failing to make
                // it only costs the convenience.
                let _ = std::os::unix::fs::symlink("libitcp.so", &link);
            }
        }
    }
}
