//! The Debian package, end to end on this machine: `scripts/deb` builds it from the
//! binaries under test, `dpkg -i` installs it and makes the `itcp` user msrd runs as,
//! the installed msrd validates the installed `/etc/itcp/msrd.toml`, `systemd-analyze
//! verify` (where installed) accepts the units, the C library has its SONAME and makes
//! the MH's session token, `dpkg -r` keeps only the conffiles and `dpkg -P` leaves
//! nothing behind, the token and the user included.
//!
//! Also, without root: `systemd-analyze security` scores the shipped msrd.service at an
//! exposure of 3.0 at most (scripts/setup.sh installs systemd-analyze; no skipping).
//!
//! The package test needs root and dpkg; without them it says so and passes. It refuses to run (and
//! fails, changing nothing) when a package `itcp` is installed that it did not install
//! itself, or when any file of the package already exists on the machine. Whatever
//! happens, a guard purges what it installed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use itcp_testbed::lab::bin_path;

/// Written before installing, removed after purging: a package found installed with
/// this marker present was left by a killed run of this test, not by an operator.
const MARKER: &str = "/var/lib/dpkg/itcp-package-test.marker";
const PACKAGES: &[&str] = &["itcp", "itcp-dev"];

fn sh(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

fn ok(cmd: &str, args: &[&str]) -> String {
    let out = sh(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// dpkg's status of a package (`install ok installed`, `deinstall ok config-files`),
/// or `None` when dpkg knows nothing of it.
fn status(pkg: &str) -> Option<String> {
    let out = sh("dpkg-query", &["-W", "-f=${Status}", pkg]);
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !s.is_empty() && s != "unknown ok not-installed").then_some(s)
}

/// Purges our packages on drop, whatever state the test left them in, and removes the
/// directory the packages were built in.
struct Guard(PathBuf);

impl Guard {
    fn purge() {
        for p in PACKAGES.iter().rev() {
            if status(p).is_some() {
                let _ = sh("dpkg", &["--purge", p]);
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        Guard::purge();
        let _ = std::fs::remove_dir_all(&self.0);
        if PACKAGES.iter().all(|p| status(p).is_none()) {
            let _ = std::fs::remove_file(MARKER);
        } else {
            eprintln!("package test: could not purge {PACKAGES:?}; {MARKER} kept");
        }
    }
}

/// Paths of the package on the machine, and the directories it makes or its scripts do.
fn existing(files: &[PathBuf]) -> Vec<PathBuf> {
    files
        .iter()
        .cloned()
        .chain(["/etc/itcp", "/var/log/itcp", "/run/itcp-mh"].map(PathBuf::from))
        .filter(|f| f.symlink_metadata().is_ok())
        .collect()
}

/// The regular files and symlinks of a .deb, as absolute paths.
fn files_of(deb: &Path) -> Vec<PathBuf> {
    let listing = ok("dpkg-deb", &["-c", deb.to_str().unwrap()]);
    listing
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| PathBuf::from(p.trim_start_matches('.')))
        .collect()
}

/// The `itcp` user's passwd entry, if there is one.
fn itcp_user() -> Option<String> {
    let out = sh("getent", &["passwd", "itcp"]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The exposure `systemd-analyze security --offline` gives a unit file (0.0–10.0).
fn exposure(unit: &Path) -> (f64, String) {
    assert!(
        have("systemd-analyze"),
        "systemd-analyze is missing: run scripts/setup.sh (it installs systemd)"
    );
    let out = sh(
        "systemd-analyze",
        &["security", "--offline=true", unit.to_str().unwrap()],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let level = text
        .lines()
        .find_map(|l| l.split("Overall exposure level for ").nth(1))
        .and_then(|l| l.split(": ").nth(1))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no exposure in systemd-analyze's output: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    (level, text)
}

#[test]
fn the_msrd_unit_is_sandboxed_to_an_exposure_of_at_most_3_0() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/msrd.service");
    let (level, text) = exposure(&unit);
    eprintln!("msrd.service: exposure {level}");
    assert!(
        level <= 3.0,
        "msrd.service's exposure is {level} (> 3.0):\n{text}"
    );
    // The same bound as systemd-analyze's own --threshold (in tenths).
    let out = sh(
        "systemd-analyze",
        &[
            "security",
            "--offline=true",
            "--threshold=30",
            unit.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "--threshold=30 failed:\n{text}");
    // Not root: its own user, with the capabilities msrd keeps and nothing else.
    let body = std::fs::read_to_string(&unit).unwrap();
    for line in [
        "User=itcp",
        "Group=itcp",
        "CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE CAP_SYS_RESOURCE",
        "AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE CAP_SYS_RESOURCE",
    ] {
        assert!(
            body.lines().any(|l| l == line),
            "msrd.service has no {line}"
        );
    }
}

#[test]
fn deb_installs_checks_and_purges_cleanly() {
    if unsafe { libc::geteuid() } != 0 || !have("dpkg") || !have("dpkg-deb") {
        eprintln!("package test: needs root and dpkg; skipped");
        return;
    }
    // Someone else's installation is never touched.
    for p in PACKAGES {
        if let Some(s) = status(p) {
            assert!(
                Path::new(MARKER).exists(),
                "package {p} is installed ({s}) and not by this test: refusing to run"
            );
        }
    }
    if Path::new(MARKER).exists() {
        eprintln!("package test: purging what a killed run left installed");
        Guard::purge();
    }

    // Build the packages from the binaries under test.
    let bins = bin_path("msrd").parent().unwrap().to_path_buf();
    let out_dir = std::env::temp_dir().join(format!("itcp-deb-test-{}", std::process::id()));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join("scripts/deb"))
        .args(["--no-build", "--out", out_dir.to_str().unwrap()])
        .env("ITCP_BIN_DIR", &bins)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/deb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let debs: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect();
    let version = env!("CARGO_PKG_VERSION");
    let arch = ok("dpkg", &["--print-architecture"]).trim().to_string();
    assert_eq!(
        debs[0].file_name().unwrap().to_string_lossy(),
        format!("itcp_{version}_{arch}.deb")
    );
    let files: Vec<PathBuf> = debs.iter().flat_map(|d| files_of(d)).collect();
    for f in [
        "/usr/bin/msrd",
        "/usr/bin/itcpctl",
        "/usr/bin/itcp-mh-agent",
        "/lib/systemd/system/msrd.service",
        "/lib/systemd/system/itcp-mh-agent.service",
        "/etc/itcp/msrd.toml",
        "/etc/itcp/mh.toml",
        "/etc/itcp/mh-agent.env",
        "/usr/share/man/man1/msrd.1.gz",
        "/usr/share/man/man1/itcpctl.1.gz",
        "/usr/share/man/man1/itcp-mh-agent.1.gz",
    ] {
        assert!(
            files.contains(&PathBuf::from(f)),
            "{f} is not in the package: {files:?}"
        );
    }
    if bins.join("libitcp.a").exists() {
        assert!(
            debs.len() == 2,
            "libitcp.a exists but no itcp-dev was built: {debs:?}"
        );
        assert!(files.contains(&PathBuf::from("/usr/include/itcp.h")));
    }
    let conffiles = ok(
        "sh",
        &[
            "-c",
            &format!(
                "dpkg-deb --ctrl-tarfile {} | tar -xO ./conffiles",
                debs[0].display()
            ),
        ],
    );
    for c in [
        "/etc/itcp/msrd.toml",
        "/etc/itcp/mh.toml",
        "/etc/itcp/mh-agent.env",
    ] {
        assert!(
            conffiles.lines().any(|l| l == c),
            "{c} is not a conffile: {conffiles}"
        );
    }
    // Nothing of the package may exist yet: installing must not overwrite anything.
    let present = existing(&files);
    assert!(
        present.is_empty(),
        "refusing to install over existing files: {present:?}"
    );

    // An operator's own itcp user is used as it is, and kept on purge.
    let user_before = itcp_user();

    // From here on the guard purges whatever happens.
    std::fs::write(MARKER, "installed by itcp's tests/tests/package.rs\n").unwrap();
    let guard = Guard(out_dir);
    let mut install = vec!["-i"];
    install.extend(debs.iter().map(|d| d.to_str().unwrap()));
    ok("dpkg", &install);
    assert_eq!(status("itcp").as_deref(), Some("install ok installed"));
    assert!(
        Path::new("/var/log/itcp").is_dir(),
        "postinst made no /var/log/itcp"
    );
    // The system user msrd runs as, owning its log directory.
    let user = itcp_user().expect("postinst made no itcp user");
    if user_before.is_none() {
        assert!(
            user.ends_with(":/nonexistent:/usr/sbin/nologin"),
            "itcp is a login user: {user}"
        );
    }
    let logs = ok("stat", &["-c", "%U:%G %a", "/var/log/itcp"]);
    assert_eq!(logs.trim(), "itcp:itcp 750");

    // The installed daemon accepts the installed configuration; every binary runs.
    let check = ok("/usr/bin/msrd", &["--check-config", "/etc/itcp/msrd.toml"]);
    assert_eq!(check, "/etc/itcp/msrd.toml: ok\n");
    for b in ["msrd", "itcpctl", "itcp-mh-agent"] {
        assert_eq!(
            ok(&format!("/usr/bin/{b}"), &["--version"]),
            format!("{b} {version}\n")
        );
    }
    // The agent's unit passes mh.toml: it must load (a bad key would fail the unit).
    itcp_config::MhConfig::load("/etc/itcp/mh.toml").expect("/etc/itcp/mh.toml");
    if have("systemd-analyze") {
        let out = sh(
            "systemd-analyze",
            &[
                "verify",
                "/lib/systemd/system/msrd.service",
                "/lib/systemd/system/itcp-mh-agent.service",
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !err.contains("msrd") && !err.contains("itcp"),
            "systemd-analyze verify: {err}"
        );
    } else {
        eprintln!("package test: no systemd-analyze, units not verified");
    }
    // The C library is installed under its SONAME, which the dynamic linker finds; a
    // program using it creates the MH's session token, which only a purge removes.
    let lib = files
        .iter()
        .find(|f| f.file_name().is_some_and(|n| n == "libitcp.so.0"));
    if let Some(lib) = lib {
        assert!(lib.exists(), "{} not installed", lib.display());
        let dynamic = ok("readelf", &["-d", lib.to_str().unwrap()]);
        assert!(
            dynamic.contains("Library soname: [libitcp.so.0]"),
            "{} has no SONAME: {dynamic}",
            lib.display()
        );
        assert!(
            files.iter().any(|f| f.ends_with("libitcp.so")),
            "no libitcp.so link for -litcp: {files:?}"
        );
        if have("python3") {
            // Refused at once: the token is made before the gateway is asked.
            let out = Command::new("python3")
                .args([
                    "-c",
                    "import ctypes; ctypes.CDLL('libitcp.so.0').itcp_connect(b'127.0.0.1', 9)",
                ])
                .env("ITCP_GATEWAY", "127.0.0.1:9")
                .env_remove("ITCP_TOKEN")
                .env_remove("ITCP_TOKEN_FILE")
                .env_remove("ITCP_MH_CONFIG")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "python3 with libitcp.so.0: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                Path::new("/run/itcp-mh/token").exists(),
                "the library made no /run/itcp-mh/token"
            );
        }
    }
    if have("man") {
        let page = ok("man", &["-w", "msrd"]);
        assert_eq!(page.trim(), "/usr/share/man/man1/msrd.1.gz");
    }

    // Remove: only the conffiles (and the logs) stay.
    let mut remove = vec!["-r"];
    remove.extend(PACKAGES.iter().rev().filter(|p| status(p).is_some()));
    ok("dpkg", &remove);
    assert_eq!(status("itcp").as_deref(), Some("deinstall ok config-files"));
    assert!(!Path::new("/usr/bin/msrd").exists());
    assert!(
        Path::new("/etc/itcp/msrd.toml").exists(),
        "dpkg -r must keep conffiles"
    );

    // Purge: nothing left.
    let mut purge = vec!["-P"];
    purge.extend(PACKAGES.iter().rev().filter(|p| status(p).is_some()));
    ok("dpkg", &purge);
    for p in PACKAGES {
        assert_eq!(status(p), None, "{p} still known to dpkg");
    }
    let left = existing(&files);
    assert!(left.is_empty(), "left after dpkg -P: {left:?}");
    if user_before.is_none() {
        assert_eq!(itcp_user(), None, "the itcp user outlived dpkg -P");
    } else {
        assert_eq!(
            itcp_user(),
            user_before,
            "an operator's itcp user was changed"
        );
    }
    drop(guard);
    assert!(!Path::new(MARKER).exists());
}
