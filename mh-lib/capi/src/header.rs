//! The C header `include/itcp.h`, rendered from the Rust definitions.
//!
//! The exported functions, the event struct and the constants are declared through the
//! macros in `lib.rs`, which also record each item here (name, doc comment, C types of
//! the Rust types). [`render`] turns those tables into the header; the unit test
//! `header_is_current` fails when the committed file differs, and rewrites it when run
//! with `ITCP_BLESS=1`. So the header cannot drift from the code: a changed signature or
//! doc comment changes the rendered text.

use std::fmt::Write as _;

/// A Rust type that crosses the C ABI, with its C spelling.
pub trait CType {
    /// The C type (pointers end in `*`).
    const C: &'static str;
}

macro_rules! c_types {
    ($($t:ty => $c:expr),* $(,)?) => { $(impl CType for $t { const C: &'static str = $c; })* };
}

c_types! {
    () => "void",
    libc::c_int => "int",
    u16 => "uint16_t",
    u32 => "uint32_t",
    f64 => "double",
    *const libc::c_char => "const char *",
    *mut libc::c_void => "void *",
    *mut libc::sockaddr_storage => "struct sockaddr_storage *",
    *mut libc::socklen_t => "socklen_t *",
    crate::ItcpEventCb => "itcp_event_cb",
}

/// An exported function.
pub struct Function {
    pub name: &'static str,
    pub doc: &'static [&'static str],
    pub ret: &'static str,
    pub args: &'static [(&'static str, &'static str)],
}

/// A `#define`d integer constant.
pub struct Constant {
    pub name: &'static str,
    pub doc: &'static [&'static str],
    pub value: i64,
}

/// A `#[repr(C)]` struct.
pub struct Struct {
    pub name: &'static str,
    pub doc: &'static [&'static str],
    pub fields: &'static [(&'static str, &'static str, &'static [&'static str])],
}

/// Text before the declarations: the library's overview.
const PREAMBLE: &str = r#"/*
 * itcp.h: the I-TCP mobile-host library for C (libitcp.so, libitcp.a).
 *
 * GENERATED from mh-lib/capi/src (the Rust definitions and their doc comments) by the
 * unit test `header_is_current` of the crate itcp-mh-c. Do not edit: change the Rust
 * side and run `ITCP_BLESS=1 cargo test -p itcp-mh-c`.
 *
 * An application on a mobile host (MH) opens its TCP connections through its current
 * mobility support router (MSR), which splits each into a wireless and a fixed half
 * (Bakre & Badrinath, I-TCP). The functions below are the paper's calls: they return
 * ordinary connected socket file descriptors that read, write, poll and close like any
 * TCP socket; the bytes reach the peer through the MSR.
 *
 * Configuration, read at each call (see mh-lib/src/options.rs):
 *   ITCP_MH_CONFIG  an MH config file (mh.toml); else
 *   ITCP_GATEWAY    the gateway (addr:port, addr -> port 1080), else the default route's
 *                   gateway at port 1080;
 *   ITCP_TOKEN      the session token (32 hex digits), else ITCP_TOKEN_FILE, else
 *                   /run/itcp-mh/token (created if absent).
 *
 * Errors: functions returning int return -1 and set errno (see each function); the
 * thread's last error message is itcp_last_error(). Failures reported by the MSR map
 * as: refused ECONNREFUSED, network unreachable ENETUNREACH, host unreachable
 * EHOSTUNREACH, timed out ETIMEDOUT, not allowed EACCES, address in use EADDRINUSE,
 * no such listener ENOENT, not supported EOPNOTSUPP, general failure EIO; a malformed
 * answer EPROTO; no gateway configured ENOENT; a bad argument EINVAL.
 *
 * Thread safety: every function may be called from any thread, concurrently. Blocking
 * calls (itcp_connect, itcp_listen, itcp_accept) block only the calling thread.
 *
 * Link with -litcp (shared; add -Wl,-rpath,DIR or set LD_LIBRARY_PATH), or libitcp.a
 * plus -lpthread -ldl -lm.
 */"#;

fn comment(out: &mut String, indent: &str, lines: &[&str]) {
    if lines.is_empty() {
        return;
    }
    if let [one] = lines {
        let l = one
            .strip_prefix(' ')
            .unwrap_or(one)
            .trim_end()
            .replace('`', "");
        if indent.len() + l.len() + 6 <= 88 {
            let _ = writeln!(out, "{indent}/* {l} */");
            return;
        }
    }
    out.push_str(indent);
    out.push_str("/*\n");
    for l in lines {
        // Rustdoc lines start with one space; keep the text, drop the trailing blanks.
        let l = l.strip_prefix(' ').unwrap_or(l).trim_end();
        let l = l.replace('`', "");
        if l.is_empty() {
            let _ = writeln!(out, "{indent} *");
        } else {
            let _ = writeln!(out, "{indent} * {l}");
        }
    }
    out.push_str(indent);
    out.push_str(" */\n");
}

fn decl(ty: &str, name: &str) -> String {
    if ty.ends_with('*') {
        format!("{ty}{name}")
    } else {
        format!("{ty} {name}")
    }
}

/// The header's text.
pub fn render(consts: &[Constant], structs: &[Struct], funcs: &[Function]) -> String {
    let mut out = String::new();
    out.push_str(PREAMBLE);
    out.push_str("\n#ifndef ITCP_H\n#define ITCP_H\n\n");
    out.push_str("#include <stdint.h>\n#include <sys/socket.h>\n\n");
    out.push_str("#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n");
    for c in consts {
        comment(&mut out, "", c.doc);
        let _ = writeln!(out, "#define {} {}\n", c.name, c.value);
    }
    for s in structs {
        comment(&mut out, "", s.doc);
        let _ = writeln!(out, "struct {} {{", s.name);
        for (name, ty, doc) in s.fields {
            comment(&mut out, "    ", doc);
            let _ = writeln!(out, "    {};", decl(ty, name));
        }
        out.push_str("};\n\n");
    }
    out.push_str(
        "/*\n * The event callback: see itcp_set_event_callback. event and its strings are\n * valid only during the call.\n */\n",
    );
    out.push_str("typedef void (*itcp_event_cb)(const struct itcp_event *event, void *user);\n\n");
    for f in funcs {
        comment(&mut out, "", f.doc);
        let args = if f.args.is_empty() {
            "void".to_string()
        } else {
            f.args
                .iter()
                .map(|(n, t)| decl(t, n))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(out, "{}({args});\n", decl(f.ret, f.name));
    }
    out.push_str("#ifdef __cplusplus\n}\n#endif\n\n#endif /* ITCP_H */\n");
    out
}

/// Path of the committed header.
pub fn header_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include/itcp.h")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_current() {
        let text = crate::header_text();
        let path = header_path();
        if std::env::var_os("ITCP_BLESS").is_some() {
            std::fs::write(&path, &text).unwrap();
            return;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == text,
            "{} is out of date with the Rust definitions: run `ITCP_BLESS=1 cargo test -p itcp-mh-c` and commit it",
            path.display()
        );
    }

    #[test]
    fn every_function_is_documented() {
        for f in crate::FUNCTIONS {
            assert!(!f.doc.is_empty(), "{} needs a doc comment", f.name);
            let doc = f.doc.join("\n");
            let fallible = f.ret == "int" && f.name != "itcp_last_errno";
            if fallible {
                assert!(
                    doc.contains("errno"),
                    "{}: document the errno values",
                    f.name
                );
            }
        }
    }

    #[test]
    fn header_compiles_as_strict_c() {
        // The header must stand alone (its own includes) and be strict-C clean.
        let dir = std::env::temp_dir().join(format!("itcp-h-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("t.c");
        std::fs::write(
            &src,
            "#include \"itcp.h\"\nint main(void) { return itcp_close(-1) == -1 ? 0 : 1; }\n",
        )
        .unwrap();
        let inc = header_path().parent().unwrap().to_path_buf();
        let out = std::process::Command::new("cc")
            .args([
                "-std=c99",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic",
                "-fsyntax-only",
            ])
            .arg("-I")
            .arg(&inc)
            .arg(&src)
            .output()
            .expect("cc (a C compiler) is needed to check itcp.h");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn declarations_read_like_c() {
        assert_eq!(decl("const char *", "host"), "const char *host");
        assert_eq!(decl("int", "fd"), "int fd");
        let text = crate::header_text();
        assert!(text.contains("int itcp_connect(const char *host, uint16_t port);"));
        assert!(text.contains(
            "int itcp_accept(int listen_fd, struct sockaddr_storage *peer, socklen_t *len);"
        ));
    }
}
