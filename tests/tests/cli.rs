//! Every binary's command line: `--help`, `--version`, unknown flags and bad values
//! (usage errors naming the flag, exit status 2), and the man pages in docs/man, which
//! must match what the binaries' flag tables generate (`--man`).
//!
//! Regenerate the committed man pages with `ITCP_UPDATE_MAN=1 cargo test --release
//! --test cli` (or `scripts/man`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use itcp_testbed::lab::bin_path;

const BINARIES: &[&str] = &[
    "msrd",
    "itcpctl",
    "itcp-mh-agent",
    "itcp-lab",
    "airlink",
    "ttcp",
];

fn run(bin: &str, args: &[&str]) -> Output {
    let path = bin_path(bin);
    Command::new(&path)
        .args(args)
        .env_remove("ITCP_GATEWAY")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (build the workspace's binaries first)",
                path.display()
            )
        })
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn man_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/man")
}

#[test]
fn help_and_version_everywhere() {
    let version = env!("CARGO_PKG_VERSION");
    for bin in BINARIES {
        for h in ["--help", "-h"] {
            let out = run(bin, &[h]);
            let stdout = text(&out.stdout);
            assert!(out.status.success(), "{bin} {h}: {}", text(&out.stderr));
            assert!(
                stdout.starts_with(&format!("{bin} {version}: ")) && stdout.contains("usage: "),
                "{bin} {h}: {stdout}"
            );
            assert!(stdout.contains("--version"), "{bin} {h}: {stdout}");
        }
        for v in ["--version", "-V"] {
            let out = run(bin, &[v]);
            assert!(out.status.success(), "{bin} {v}");
            assert_eq!(text(&out.stdout), format!("{bin} {version}\n"), "{bin} {v}");
        }
    }
}

#[test]
fn unknown_flags_are_usage_errors_naming_the_flag() {
    // The unknown flag after what each binary needs first (its command, if any).
    for (bin, args) in [
        ("msrd", &["--frobnicate"][..]),
        ("msrd", &["--config", "/etc/itcp/msrd.toml", "--frobnicate"]),
        ("itcpctl", &["sessions", "--frobnicate"]),
        ("itcpctl", &["--frobnicate"]),
        (
            "itcp-mh-agent",
            &["--interface", "air0", "--mh", "10.2.0.100", "--frobnicate"],
        ),
        ("itcp-lab", &["bench", "relay", "--frobnicate"]),
        ("itcp-lab", &["--frobnicate"]),
        ("airlink", &["--frobnicate"]),
        ("ttcp", &["rr", "--frobnicate"]),
    ] {
        let out = run(bin, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bin} {args:?}: {err}");
        assert!(
            err.starts_with(&format!("{bin}: unknown flag --frobnicate")),
            "{bin} {args:?}: {err}"
        );
        assert!(err.contains("usage: "), "{bin} {args:?}: {err}");
        assert!(out.stdout.is_empty(), "{bin} {args:?}");
    }
}

#[test]
fn bad_values_are_usage_errors_naming_the_flag() {
    for (bin, args, msg) in [
        (
            "itcp-mh-agent",
            &[
                "--interface",
                "air0",
                "--mh",
                "10.2.0.100",
                "--beacon-port",
                "70000",
            ][..],
            "itcp-mh-agent: --beacon-port: 70000 is not a port (1-65535)",
        ),
        (
            "itcp-mh-agent",
            &[
                "--interface",
                "air0",
                "--mh",
                "10.2.0.100",
                "--policy",
                "fast",
            ],
            "itcp-mh-agent: --policy: \"fast\" is not one of eager, lazy",
        ),
        (
            "itcp-mh-agent",
            &["--interface", "air0"],
            "itcp-mh-agent: --mh ADDR (the MH's address) is required",
        ),
        ("msrd", &["--config"], "msrd: --config needs a value (FILE)"),
        (
            "itcpctl",
            &["handoffs", "--mh", "nowhere"],
            "itcpctl: --mh: \"nowhere\" is not an IP address",
        ),
        (
            "itcpctl",
            &["handoffs", "--since", "yesterday"],
            "itcpctl: --since: \"yesterday\" is not a time: expected ISO 8601",
        ),
        (
            "itcpctl",
            &["handoffs", "--until", "2025-02-30T10:00Z"],
            "itcpctl: --until: \"2025-02-30T10:00Z\" is not a time: day \"30\" is not 1-28",
        ),
        (
            "itcp-lab",
            &["bench", "conns", "--count", "-3"],
            "itcp-lab: --count: -3 is out of range (at least 0)",
        ),
        (
            "itcp-lab",
            &["bench", "baseline", "--scale", "0"],
            "itcp-lab: --scale: \"0\" is not a number greater than 0",
        ),
        (
            "ttcp",
            &["send", "--connect", "127.0.0.1:9", "--bytes", "12Q"],
            "ttcp: --bytes: '12Q' is not a size",
        ),
        (
            "itcp-lab",
            &["bench", "moon"],
            "itcp-lab: unknown command 'moon' after 'bench'",
        ),
    ] {
        let out = run(bin, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bin} {args:?}: {err}");
        assert!(err.starts_with(msg), "{bin} {args:?}: {err}");
    }
}

#[test]
fn committed_man_pages_match_the_flag_tables() {
    let update = std::env::var_os("ITCP_UPDATE_MAN").is_some();
    let dir = man_dir();
    let mut stale = Vec::new();
    for bin in BINARIES {
        let out = run(bin, &["--man"]);
        assert!(out.status.success(), "{bin} --man");
        let page = text(&out.stdout);
        assert!(
            page.contains(&format!(".TH \"{}\" \"1\"", bin.to_uppercase())),
            "{bin}: {page}"
        );
        let file = dir.join(format!("{bin}.1"));
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&file, &page).unwrap();
        } else if std::fs::read_to_string(&file).ok().as_deref() != Some(page.as_str()) {
            stale.push(file.display().to_string());
        }
        // groff, where installed, renders it without a warning.
        if let Ok(g) = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-z"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
        {
            use std::io::Write;
            let mut g = g;
            g.stdin.take().unwrap().write_all(page.as_bytes()).unwrap();
            let out = g.wait_with_output().unwrap();
            assert!(
                out.status.success() && out.stderr.is_empty(),
                "{bin}: groff: {}",
                text(&out.stderr)
            );
        }
    }
    assert!(
        stale.is_empty(),
        "man pages differ from the binaries' flag tables: {stale:?}; regenerate them with \
         ITCP_UPDATE_MAN=1 cargo test --release --test cli (or scripts/man)"
    );
}
