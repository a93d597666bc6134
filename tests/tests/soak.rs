//! The chaos soak (`itcp-lab bench soak`), briefly: several MHs, moves and faults for a
//! few seconds. The soak's verdict depends on msrd (its findings are the point of a
//! long run); this test checks that the soak runs, that its report has its shape, that
//! the exit status agrees with the verdict, and that no byte was ever corrupted.
//! Needs root.

use itcp_testbed::lab::bin_path;
use serde_json::Value;

#[test]
fn a_short_soak_reports_in_shape_and_corrupts_nothing() {
    let t0 = std::time::Instant::now();
    let out = std::process::Command::new(bin_path("itcp-lab"))
        .args([
            "bench",
            "soak",
            "--seconds",
            "15",
            "--mhs",
            "3",
            "--seed",
            "1",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    eprintln!("{text}\n(took {:?})", t0.elapsed());
    let line = text
        .lines()
        .find(|l| l.starts_with("{\"bench\":\"soak\""))
        .unwrap_or_else(|| panic!("no JSON report line:\n{text}\n{err}"));
    let v: Value = serde_json::from_str(line).unwrap();
    for k in [
        "ok",
        "problems",
        "moves",
        "faults",
        "handoffs",
        "transfers",
        "bytes",
        "rsts",
        "msrd",
        "unexplained",
        "fault_log",
    ] {
        assert!(v.get(k).is_some(), "the report lacks {k}: {line}");
    }
    // The text tables.
    for t in [
        "Handoffs",
        "Transfers",
        "RSTs",
        "msrd, start → end",
        "Verdict:",
    ] {
        assert!(text.contains(t), "no {t:?} in the report:\n{text}");
    }
    assert_eq!(v["mhs"], 3);
    assert_eq!(v["msrd"].as_array().unwrap().len(), 3);
    for m in v["msrd"].as_array().unwrap() {
        assert!(m["start"]["fds"].as_u64().unwrap() > 0, "{m}");
        assert!(m["start"]["rss_kib"].as_u64().unwrap() > 0, "{m}");
    }
    // Work was done: moves, handoffs, transfers, verified bytes.
    assert!(v["moves"]["total"].as_u64().unwrap() > 0, "{line}");
    assert!(
        v["handoffs"]["new"]["moved"].as_u64().unwrap() > 0,
        "{line}"
    );
    assert!(v["transfers"]["completed"].as_u64().unwrap() > 0, "{line}");
    assert!(
        v["bytes"]["verified"].as_u64().unwrap() > 1_000_000,
        "{line}"
    );
    // Never a corrupted byte, whatever else the soak found.
    assert_eq!(v["transfers"]["corrupted"], 0, "{text}");
    // The exit status is the verdict.
    assert_eq!(
        out.status.success(),
        v["ok"].as_bool().unwrap(),
        "exit status {:?} vs verdict {}\n{err}",
        out.status,
        v["ok"]
    );
}
