//! The nftables ruleset msrd generates (`itcp_proxy::intercept::Rules::nft_script`) is
//! accepted by the kernel for every combination of its parts (transparent mode,
//! network detection, IPv4 and IPv6 prefixes, the cell guard, handshake reports):
//! `nft -c` (the kernel checks the whole transaction, then drops it) in a network
//! namespace of its own that has the cells' interfaces. Needs root and nft.

use std::io::Write;
use std::process::{Command, Stdio};

use itcp_proxy::intercept::{CellGuard, Detection, Rules, Transparent};

/// Which address families the MH prefixes (and the cells' gateways) have.
#[derive(Clone, Copy)]
struct Families {
    v4: bool,
    v6: bool,
}

fn prefixes(f: Families) -> Vec<itcp_config::IpPrefix> {
    let mut p = Vec::new();
    if f.v4 {
        p.push("10.2.0.0/24".parse().unwrap());
    }
    if f.v6 {
        p.push("2001:db8:2::/64".parse().unwrap());
    }
    p
}

fn rules(tp: bool, detect: bool, f: Families, guard: bool, reports: bool) -> Rules {
    let cells = vec!["cell0".to_string(), "cell1".to_string()];
    let mut gateways: Vec<std::net::IpAddr> = Vec::new();
    if f.v4 {
        gateways.push("10.2.0.1".parse().unwrap());
    }
    if f.v6 {
        gateways.push("2001:db8:2::1".parse().unwrap());
    }
    Rules {
        table: "itcp_msrd".into(),
        fwmark: 0x4954,
        route_table: 4954,
        transparent: tp.then(|| Transparent {
            mh_prefixes: prefixes(f),
            ports: vec![80, 443, 5001],
            listen_port: 1081,
        }),
        detect: detect.then(|| Detection {
            interfaces: cells.clone(),
            mh_prefixes: prefixes(f),
            gateways,
            group: 4956,
            hold_ms: 250,
            greet_port: 4346,
        }),
        mh_prefixes: prefixes(f),
        hold_queue: 4954,
        handshake_group: reports.then_some(4955),
        cell_guard: guard.then(|| CellGuard {
            interfaces: cells,
            ports: vec![4347, 9473],
        }),
    }
}

/// `nft -c -f -` of `script` in a new network namespace with interfaces cell0, cell1.
fn nft_check(script: &str) -> Result<(), String> {
    let mut child = Command::new("unshare")
        .args([
            "-n",
            "sh",
            "-ec",
            "ip link add cell0 type veth peer name cell1; nft -c -f -",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("unshare: {e}"))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn every_combination_of_the_generated_rules_passes_nft_check() {
    let mut checked = 0;
    let mut failed = Vec::new();
    for bits in 0..16u32 {
        let on = |i: u32| bits & (1 << i) != 0;
        for (v4, v6) in [(true, false), (false, true), (true, true)] {
            let r = rules(on(0), on(1), Families { v4, v6 }, on(2), on(3));
            let script = r.nft_script();
            if let Err(e) = nft_check(&script) {
                failed.push(format!(
                    "combination {bits:04b} v4 {v4} v6 {v6}: {e}\n{script}"
                ));
            }
            checked += 1;
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    assert_eq!(checked, 48);
}

/// The check is real: a ruleset with an error in it is refused.
#[test]
fn nft_check_refuses_a_broken_ruleset() {
    let both = Families { v4: true, v6: true };
    let script = rules(true, true, both, true, true).nft_script();
    let broken = script.replacen("type ether_addr;", "type ether_address;", 1);
    assert_ne!(broken, script);
    assert!(nft_check(&broken).is_err());
}
