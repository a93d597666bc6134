//! msrd under a real systemd through the shipped unit (`deploy/msrd.service`): Debian's
//! systemd booted as PID 1 of namespaces of its own (`tests/systemd/msrd-unit.sh`),
//! msrd installed as the package installs it. It runs as the `itcp` user with no
//! capability beyond the unit's and no new privileges; an upgrade (`systemctl reload`)
//! hands the service to the new msrd; and `systemctl stop` after it drains that msrd
//! as it drains one systemd started, instead of killing it. Needs root, systemd,
//! util-linux and libcap2-bin (scripts/setup.sh installs them).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use itcp_testbed::lab::bin_path;

/// The unit's capabilities. CAP_SYS_RESOURCE is among them, but a machine whose own
/// bounding set lacks it (a VM's init may drop it) cannot grant it: it is checked only
/// where this process has it.
const CAPS: &[&str] = &["cap_net_admin", "cap_net_raw", "cap_net_bind_service"];

fn have_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let bnd = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .unwrap();
    let bnd = u64::from_str_radix(bnd.trim(), 16).unwrap();
    bnd & (1 << 24) != 0
}

#[test]
fn msrd_runs_unprivileged_under_systemd_and_drains_on_stop_after_an_upgrade() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = bin_path("msrd");
    let bin = bin.parent().unwrap();
    let out = Command::new("bash")
        .arg(repo.join("tests/systemd/msrd-unit.sh"))
        .arg(&repo)
        .arg(bin)
        .output()
        .expect("bash");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "msrd-unit.sh failed:\n{text}");
    let r: HashMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .filter_map(|l| l.split_once('='))
        .collect();
    let is = |k: &str, v: &str| {
        assert_eq!(r.get(k).copied(), Some(v), "{k}:\n{text}");
    };
    is("booted", "running");
    is("start_rc", "0");
    is("active", "active");
    is("user", "itcp");
    is("group", "itcp");
    is("NoNewPrivs", "1");
    let mut want: Vec<&str> = CAPS.to_vec();
    if have_sys_resource() {
        want.push("cap_sys_resource");
    }
    want.sort();
    for set in ["CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let mut got: Vec<&str> = r.get(set).copied().unwrap_or("").split(',').collect();
        got.sort();
        assert_eq!(got, want, "{set}:\n{text}");
    }
    is("reload_rc", "0");
    is("main_changed", "yes");
    is("active_after_reload", "active");
    is("stop_rc", "0");
    // Killed, the upgraded msrd would neither drain its connections nor undo its
    // rules and sysctls.
    is("stop_result", "success");
    is("sigkilled", "0");
    assert_ne!(r.get("drained").copied(), Some("0"), "no drain:\n{text}");
    // A stop with no upgrade before it drains too.
    is("restart_rc", "0");
    is("plain_stop_result", "success");
    let drained: u32 = r.get("drained_total").unwrap_or(&"0").parse().unwrap();
    assert!(drained >= 2, "{drained} drains:\n{text}");
}
