//! Loading tests across the crate: defaults, every class of error, the examples.

use std::net::IpAddr;

use crate::*;

const MIN: &str = "[msr]\ngateway = [\"10.2.0.1\"]\n\n[access]\nmh_prefixes = [\"10.2.0.0/24\"]\n";

fn msrd(text: &str) -> Result<MsrdConfig, ConfigError> {
    MsrdConfig::from_str(text, "msrd.toml")
}

/// Loads `text` expecting an error; checks that the message names the file and `key`.
#[track_caller]
fn msrd_err(text: &str, key: &str) -> ConfigError {
    let e = msrd(text).expect_err("config should be rejected");
    let shown = e.to_string();
    eprintln!("{shown}");
    assert!(shown.starts_with("msrd.toml: "), "no file name in: {shown}");
    assert!(shown.contains(key), "key {key:?} not named in: {shown}");
    assert_eq!(e.origin(), "msrd.toml");
    e
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn msrd_defaults() {
    let c = msrd(MIN).unwrap();
    assert!(!c.msr.id.is_empty());
    assert_eq!(c.msr.gateway, vec![ip("10.2.0.1")]);
    assert_eq!(c.msr.socks_port, 1080);
    assert_eq!(
        c.msr.control_socket.to_str(),
        Some("/run/msrd/control.sock")
    );
    assert_eq!(c.msr.log_level, LogLevel::Info);
    assert_eq!(c.msr.log_format, LogFormat::Text);
    assert_eq!(
        c.access.mh_prefixes,
        vec!["10.2.0.0/24".parse::<IpPrefix>().unwrap()]
    );
    assert_eq!(c.access.max_connections, 100_000);
    assert_eq!(c.access.max_connections_per_mh, 4096);
    assert_eq!(c.access.accept_rate, 5000);
    assert_eq!(c.access.accept_burst, 10_000);
    assert_eq!(c.relay, RelaySection::default());
    assert!(c.relay.splice);
    assert_eq!(c.relay.pipe_size, 1_048_576);
    assert_eq!(c.relay.buffer_size, 65_536);
    assert_eq!(c.relay.connect_timeout().as_millis(), 10_000);
    assert_eq!(c.relay.drain_timeout().as_millis(), 30_000);
    assert!(c.wireless.is_empty());
    assert!(c.fixed.is_empty());
    assert!(c.cells.is_empty());
    assert!(!c.transparent.enabled);
    assert!(c.transparent.ports.is_empty());
    assert_eq!(c.transparent.listen_port, 1081);
    assert_eq!(c.interception.nft_table, "itcp_msrd");
    assert_eq!(c.interception.fwmark, 0x4954);
    assert_eq!(c.interception.route_table, 4954);
    assert!(c.access.allows(ip("10.2.0.9")));
    assert!(!c.access.allows(ip("10.3.0.9")));
}

#[test]
fn mh_defaults() {
    let c = MhConfig::from_str("", "mh.toml").unwrap();
    assert_eq!(c, MhConfig::default());
    assert_eq!(c.mh.gateway, None);
    assert_eq!(c.mh.token_file.to_str(), Some("/run/itcp-mh/token"));
    assert_eq!(c.mh.connect_timeout().as_millis(), 10_000);
    assert_eq!(c.mobility.beacon_port, 4345);
    assert_eq!(c.mobility.policy, MobilityPolicy::Eager);
    assert_eq!(c.mobility.hysteresis().as_millis(), 2000);
}

#[test]
fn mh_gateway_forms() {
    let g = |s: &str| {
        MhConfig::from_str(&format!("[mh]\ngateway = {s:?}\n"), "mh.toml")
            .map(|c| c.mh.gateway.unwrap().to_string())
    };
    assert_eq!(g("10.2.0.1:1080").unwrap(), "10.2.0.1:1080");
    assert_eq!(g("10.2.0.1").unwrap(), "10.2.0.1:1080");
    assert_eq!(g("[2001:db8::1]:2080").unwrap(), "[2001:db8::1]:2080");
    assert_eq!(g("2001:db8::1").unwrap(), "[2001:db8::1]:1080");
    let e = g("msr.example:1080").unwrap_err().to_string();
    assert!(
        e.starts_with("mh.toml: line 2, column 11: mh.gateway: "),
        "{e}"
    );
    let e = g("10.2.0.1:0").unwrap_err().to_string();
    assert!(e.contains("mh.gateway") && e.contains("port 0"), "{e}");
}

#[test]
fn mh_errors_name_key_and_file() {
    let e = MhConfig::from_str("[mobility]\npolicy = \"sometimes\"\n", "mh.toml").unwrap_err();
    assert_eq!(
        e.to_string(),
        "mh.toml: line 2, column 10: mobility.policy: \"sometimes\" is not a valid value (expected one of: eager, lazy)"
    );
    let e = MhConfig::from_str("[mh]\ngatway = \"10.2.0.1\"\n", "mh.toml").unwrap_err();
    assert_eq!(e.kind(), ConfigErrorKind::UnknownKey);
    assert_eq!(e.key(), Some("mh.gatway"));
    assert!(
        e.to_string().contains("unknown key \"gatway\" in [mh]"),
        "{e}"
    );
    let e = MhConfig::from_str("[mobility]\nbeacon_port = 70000\n", "mh.toml").unwrap_err();
    assert!(
        e.to_string()
            .contains("mobility.beacon_port: 70000 is not a valid TCP port"),
        "{e}"
    );
}

#[test]
fn unknown_key_at_top_level() {
    let e = msrd_err(
        &format!("{MIN}\n[wirelss]\nnodelay = true\n"),
        "\"wirelss\"",
    );
    assert_eq!(e.kind(), ConfigErrorKind::UnknownKey);
    assert_eq!(e.key(), Some("wirelss"));
    assert_eq!(e.position(), Some((7, 2)));
    assert!(e.to_string().contains("at the top level"), "{e}");
    assert!(e.to_string().contains("wireless"), "{e}");
}

#[test]
fn unknown_key_in_section() {
    let text = MIN.replace("[access]\n", "[access]\nmax_conections = 5\n");
    let e = msrd_err(&text, "\"max_conections\"");
    assert_eq!(e.kind(), ConfigErrorKind::UnknownKey);
    assert_eq!(e.key(), Some("access.max_conections"));
    assert_eq!(
        e.to_string(),
        "msrd.toml: line 5, column 1: unknown key \"max_conections\" in [access] (expected one of: \
         mh_prefixes, max_connections, max_connections_per_mh, accept_rate, accept_burst, \
         max_handshakes, max_handshakes_per_mh, max_handshakes_per_station, \
         max_addresses_per_station)"
    );
}

#[test]
fn unknown_key_in_cell() {
    let text = format!(
        "{MIN}\n[[cell]]\ninterface = \"cell0\"\n\n[[cell]]\ninterface = \"cell1\"\nnodelya = true\n"
    );
    let e = msrd_err(&text, "\"nodelya\"");
    assert_eq!(e.key(), Some("cell[1].nodelya"));
    assert!(e.to_string().contains("in cell[1]"), "{e}");
    assert!(
        e.to_string()
            .contains("interface, detect, hostapd, congestion_control"),
        "{e}"
    );
}

#[test]
fn unknown_key_in_dotted_and_inline_forms() {
    let e = msrd_err(&format!("relay.splcie = false\n{MIN}"), "\"splcie\"");
    assert_eq!(e.key(), Some("relay.splcie"));
    let e = msrd_err(
        &format!("fixed = {{ nodelay = true, bogus = 1 }}\n{MIN}"),
        "\"bogus\"",
    );
    assert_eq!(e.key(), Some("fixed.bogus"));
}

#[test]
fn missing_mh_prefixes() {
    let e = msrd_err("[msr]\ngateway = [\"10.2.0.1\"]\n", "access.mh_prefixes");
    assert_eq!(e.kind(), ConfigErrorKind::MissingKey);
    assert!(e.to_string().contains("open relay"), "{e}");
    let e = msrd_err(
        &MIN.replace("[\"10.2.0.0/24\"]", "[]"),
        "access.mh_prefixes",
    );
    assert_eq!(e.position(), Some((5, 15)));
    let e = msrd_err(
        &MIN.replace("10.2.0.0/24", "0.0.0.0/0"),
        "access.mh_prefixes[0]",
    );
    assert!(e.to_string().contains("open relay"), "{e}");
}

#[test]
fn missing_gateway() {
    let e = msrd_err("[access]\nmh_prefixes = [\"10.2.0.0/24\"]\n", "msr.gateway");
    assert_eq!(e.kind(), ConfigErrorKind::MissingKey);
    let e = msrd_err(
        &MIN.replace("\"10.2.0.1\"", "\"10.2.0.1\", \"10.2.0.x\""),
        "msr.gateway[1]",
    );
    assert!(
        e.to_string().contains("\"10.2.0.x\" is not an IP address"),
        "{e}"
    );
}

#[test]
fn bad_prefix() {
    let text = MIN.replace("[\"10.2.0.0/24\"]", "[\"10.2.0.0/24\", \"10.2.0.0/33\"]");
    let e = msrd_err(&text, "access.mh_prefixes[1]");
    assert_eq!(e.key(), Some("access.mh_prefixes[1]"));
    assert_eq!(
        e.to_string(),
        "msrd.toml: line 5, column 31: access.mh_prefixes[1]: \"10.2.0.0/33\" is not an IP prefix \
         (prefix length must be 0..=32 for IPv4)"
    );
}

#[test]
fn ipv6_everywhere() {
    let text = "[msr]\ngateway = [\"10.2.0.1\", \"2001:db8:2::1\"]\n\
                [access]\nmh_prefixes = [\"10.2.0.0/24\", \"2001:db8:2::/64\"]\n";
    let c = msrd(text).unwrap();
    assert_eq!(c.msr.gateway[1], ip("2001:db8:2::1"));
    let socks: Vec<String> = c.msr.socks_addrs().iter().map(|a| a.to_string()).collect();
    assert_eq!(socks, ["10.2.0.1:1080", "[2001:db8:2::1]:1080"]);
    assert!(c.access.allows(ip("2001:db8:2::42")));
    assert!(!c.access.allows(ip("2001:db8:3::42")));
    assert!(c.access.allows(ip("::ffff:10.2.0.42")));
}

#[test]
fn bad_ports() {
    let e = msrd_err(
        &format!("{MIN}[msr.extra]\n"),
        "unknown key \"extra\" in [msr]",
    );
    assert_eq!(e.key(), Some("msr.extra"));
    let e = msrd_err(
        &MIN.replace("[msr]\n", "[msr]\nsocks_port = 0\n"),
        "msr.socks_port",
    );
    assert!(
        e.to_string()
            .contains("0 is not a valid TCP port (expected 1..=65535)"),
        "{e}"
    );
    let e = msrd_err(
        &format!("{MIN}[transparent]\nenabled = true\nports = [80, 443, 65536]\n"),
        "transparent.ports[2]",
    );
    assert!(
        e.to_string().contains("65536 is not a valid TCP port"),
        "{e}"
    );
    let e = msrd_err(
        &format!("{MIN}[transparent]\nenabled = true\nports = [80, 443, 80]\n"),
        "transparent.ports[2]",
    );
    assert!(e.to_string().contains("listed twice"), "{e}");
    let e = msrd_err(
        &format!("{MIN}[transparent]\nenabled = true\n"),
        "transparent.ports",
    );
    assert_eq!(e.kind(), ConfigErrorKind::MissingKey);
    let e = msrd_err(
        &format!("{MIN}[transparent]\nenabled = true\nports = [80]\nlisten_port = 1080\n"),
        "transparent.listen_port",
    );
    assert!(e.to_string().contains("msr.socks_port"), "{e}");
}

#[test]
fn bad_interception() {
    let e = msrd_err(
        &format!("{MIN}[interception]\nfwmark = 0\n"),
        "interception.fwmark",
    );
    assert_eq!(e.kind(), ConfigErrorKind::InvalidValue);
    let e = msrd_err(
        &format!("{MIN}[interception]\nroute_table = 254\n"),
        "interception.route_table",
    );
    assert!(e.to_string().contains("reserved"), "{e}");
    let e = msrd_err(
        &format!("{MIN}[interception]\nfwmark = 0x1_0000_0000\n"),
        "interception.fwmark",
    );
    assert!(e.to_string().contains("out of range"), "{e}");
    // The group after it carries the SYN-ACK reports.
    let e = msrd_err(
        &format!("{MIN}[interception]\nnflog_group = 65535\n"),
        "interception.nflog_group",
    );
    assert!(e.to_string().contains("after this one"), "{e}");
    msrd_err(
        &format!("{MIN}[interception]\nnft_table = \"itcp-msrd\"\n"),
        "interception.nft_table",
    );
    let c = msrd(&format!(
        "{MIN}[interception]\nfwmark = 0x10\nroute_table = 100\n"
    ))
    .unwrap();
    assert_eq!(
        (c.interception.fwmark, c.interception.route_table),
        (16, 100)
    );
}

#[test]
fn keepalive_interval_needs_idle() {
    let e = msrd_err(
        &format!("{MIN}[wireless]\nkeepalive_interval_s = 10\n"),
        "wireless.keepalive_interval_s",
    );
    assert!(e.to_string().contains("keepalive_idle_s"), "{e}");
    msrd_err(
        &format!("{MIN}[fixed]\nkeepalive_count = 3\n"),
        "fixed.keepalive_count",
    );
    msrd_err(
        &format!("{MIN}[[cell]]\ninterface = \"cell0\"\nkeepalive_count = 3\n"),
        "cell[0].keepalive_count",
    );
    // A cell inherits [wireless]'s idle time.
    msrd(&format!(
        "{MIN}[wireless]\nkeepalive_idle_s = 30\n[[cell]]\ninterface = \"cell0\"\nkeepalive_count = 3\n"
    ))
    .unwrap();
    msrd_err(
        &format!("{MIN}[wireless]\nkeepalive_count = 128\nkeepalive_idle_s = 1\n"),
        "wireless.keepalive_count",
    );
}

#[test]
fn per_mh_limit_above_overall_limit() {
    let text = MIN.replace(
        "[access]\n",
        "[access]\nmax_connections = 100\nmax_connections_per_mh = 101\n",
    );
    let e = msrd_err(&text, "access.max_connections_per_mh");
    assert!(
        e.to_string()
            .contains("more than access.max_connections (100)"),
        "{e}"
    );
    msrd_err(
        &MIN.replace("[access]\n", "[access]\naccept_rate = 0\n"),
        "access.accept_rate",
    );
}

#[test]
fn per_station_handshakes() {
    // Unset: the per-MH value.
    let c = msrd(&MIN.replace("[access]\n", "[access]\nmax_handshakes_per_mh = 9\n")).unwrap();
    assert_eq!(c.access.handshakes_per_station(), 9);
    let c =
        msrd(&MIN.replace("[access]\n", "[access]\nmax_handshakes_per_station = 64\n")).unwrap();
    assert_eq!(c.access.handshakes_per_station(), 64);
    let e = msrd_err(
        &MIN.replace(
            "[access]\n",
            "[access]\nmax_handshakes_per_station = 1025\n",
        ),
        "access.max_handshakes_per_station",
    );
    assert!(
        e.to_string()
            .contains("more than access.max_handshakes (1024)"),
        "{e}"
    );
    msrd_err(
        &MIN.replace("[access]\n", "[access]\nmax_handshakes_per_station = 0\n"),
        "access.max_handshakes_per_station",
    );
}

#[test]
fn addresses_per_station() {
    assert_eq!(msrd(MIN).unwrap().access.max_addresses_per_station, 8);
    let c = msrd(&MIN.replace("[access]\n", "[access]\nmax_addresses_per_station = 2\n")).unwrap();
    assert_eq!(c.access.max_addresses_per_station, 2);
    msrd_err(
        &MIN.replace("[access]\n", "[access]\nmax_addresses_per_station = 0\n"),
        "access.max_addresses_per_station",
    );
}

#[test]
fn metrics_hosts_are_dns_names() {
    let c = msrd(&format!(
        "{MIN}[metrics]\nlisten = \"10.1.0.11:9473\"\nhosts = [\"msr1.mgmt.example.net\", \"msr1.\"]\n"
    ))
    .unwrap();
    assert_eq!(c.metrics.hosts.len(), 2);
    assert!(msrd(MIN).unwrap().metrics.hosts.is_empty());
    for bad in [
        "msr1:9473",
        "",
        "a..b",
        "-x.example",
        "http://x",
        "*.example",
    ] {
        let e = msrd_err(
            &format!("{MIN}[metrics]\nhosts = [\"{bad}\"]\n"),
            "metrics.hosts",
        );
        assert!(e.to_string().contains("is not a DNS name"), "{e}");
    }
}

#[test]
fn bad_log_level() {
    let e = msrd_err(
        &MIN.replace("[msr]\n", "[msr]\nlog_level = \"verbose\"\n"),
        "msr.log_level",
    );
    assert_eq!(
        e.to_string(),
        "msrd.toml: line 2, column 13: msr.log_level: \"verbose\" is not a valid value \
         (expected one of: error, warn, info, debug, trace)"
    );
}

#[test]
fn wrong_type() {
    let e = msrd_err(
        &format!("{MIN}[relay]\npipe_size = \"1M\"\n"),
        "relay.pipe_size",
    );
    assert_eq!(e.kind(), ConfigErrorKind::WrongType);
    assert!(
        e.to_string()
            .contains("expected a non-negative integer, found string \"1M\""),
        "{e}"
    );
    let e = msrd_err(
        &format!("{MIN}[wireless]\nnodelay = \"yes\"\n"),
        "wireless.nodelay",
    );
    assert_eq!(e.kind(), ConfigErrorKind::WrongType);
    let e = msrd_err(
        &MIN.replace("[\"10.2.0.0/24\"]", "\"10.2.0.0/24\""),
        "access.mh_prefixes",
    );
    assert_eq!(e.kind(), ConfigErrorKind::WrongType);
    let e = msrd_err(
        &format!("{MIN}[relay]\nconnect_timeout_ms = -5\n"),
        "relay.connect_timeout_ms",
    );
    assert!(e.to_string().contains("-5 is out of range"), "{e}");
    let e = msrd_err(&format!("wireless = 3\n{MIN}"), "wireless");
    assert_eq!(e.kind(), ConfigErrorKind::WrongType);
}

#[test]
fn relay_ranges() {
    msrd_err(
        &format!("{MIN}[relay]\npipe_size = 1024\n"),
        "relay.pipe_size",
    );
    msrd_err(
        &format!("{MIN}[relay]\nconnect_timeout_ms = 0\n"),
        "relay.connect_timeout_ms",
    );
}

#[test]
fn bad_cells() {
    let e = msrd_err(
        &format!("{MIN}[[cell]]\nnodelay = true\n"),
        "cell[0].interface",
    );
    assert_eq!(e.kind(), ConfigErrorKind::MissingKey);
    msrd_err(
        &format!("{MIN}[[cell]]\ninterface = \"a/b\"\n"),
        "cell[0].interface",
    );
    msrd_err(
        &format!("{MIN}[[cell]]\ninterface = \"wlan0-too-long-name\"\n"),
        "cell[0].interface",
    );
    let e = msrd_err(
        &format!("{MIN}[[cell]]\ninterface = \"cell0\"\n[[cell]]\ninterface = \"cell0\"\n"),
        "cell[1].interface",
    );
    assert!(e.to_string().contains("already"), "{e}");
    msrd_err(
        &format!("{MIN}[[cell]]\ninterface = \"cell0\"\ncongestion_control = \"BBR\"\n"),
        "cell[0].congestion_control",
    );
}

#[test]
fn syntax_error_has_line_and_column() {
    let e = msrd_err(
        &format!("{MIN}[relay]\nsplice = tru\n"),
        "line 7, column 10",
    );
    assert_eq!(e.kind(), ConfigErrorKind::Syntax);
    let e = msrd_err(&format!("{MIN}[access]\n"), "line");
    assert_eq!(e.kind(), ConfigErrorKind::Syntax);
    assert!(e.to_string().contains("access"), "{e}");
}

#[test]
fn datetime_values_are_rejected_with_a_position() {
    let e = msrd(&MIN.replace("[msr]\n", "[msr]\nid = 1979-05-27\n")).unwrap_err();
    eprintln!("{e}");
    assert!(e.to_string().starts_with("msrd.toml: line 2"), "{e}");
}

#[test]
fn cell_tuning_merges_over_wireless() {
    let text = format!(
        "{MIN}[wireless]\ncongestion_control = \"cubic\"\nsend_buffer = 4194304\nnodelay = true\n\
         keepalive_idle_s = 30\n\n[[cell]]\ninterface = \"cell0\"\ncongestion_control = \"bbr\"\n\
         send_buffer = 0\nwindow_clamp = 65536\n"
    );
    let c = msrd(&text).unwrap();
    let t = c.wireless_tuning_for(Some("cell0"));
    assert_eq!(t.congestion_control.as_deref(), Some("bbr"));
    assert_eq!(
        t.send_buffer,
        Some(0),
        "a cell may switch a buffer back to autotune"
    );
    assert_eq!(t.window_clamp, Some(65536));
    assert_eq!(t.nodelay, Some(true));
    assert_eq!(t.keepalive_idle_s, Some(30));
    assert_eq!(t.recv_buffer, None);
    assert_eq!(c.wireless_tuning_for(Some("cell9")), c.wireless);
    assert_eq!(c.wireless_tuning_for(None), c.wireless);
    assert!(c.cell("cell0").is_some());
}

#[test]
fn load_names_the_file() {
    let e = MsrdConfig::load("/nonexistent/msrd.toml").unwrap_err();
    assert_eq!(e.kind(), ConfigErrorKind::Io);
    assert!(
        e.to_string()
            .starts_with("/nonexistent/msrd.toml: cannot read: "),
        "{e}"
    );
    assert!(std::error::Error::source(&e).is_some());
}

#[test]
fn every_example_loads() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut loaded = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let name = path.file_name().unwrap().to_str().unwrap();
        // Settings shown commented out ("#key = value") must be valid too.
        let text = std::fs::read_to_string(&path).unwrap();
        let uncommented: String = text
            .lines()
            .map(|l| match l.strip_prefix('#') {
                Some(rest) if rest.starts_with(|c: char| c.is_ascii_lowercase() || c == '[') => {
                    rest
                }
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let origin = format!("{name} (uncommented)");
        if name.starts_with("mh") {
            MhConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
            MhConfig::from_str(&uncommented, &origin).unwrap_or_else(|e| panic!("{e}"));
        } else {
            MsrdConfig::from_str(&uncommented, &origin).unwrap_or_else(|e| panic!("{e}"));
            let c = MsrdConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
            if name == "msrd-transparent.toml" {
                assert!(c.transparent.enabled);
                assert_eq!(c.cells.len(), 2);
            }
        }
        loaded += 1;
    }
    assert!(loaded >= 3, "only {loaded} examples in {}", dir.display());
}

#[test]
fn beacon_section_defaults_and_errors() {
    let base = "[msr]\ngateway = [\"10.2.0.1\"]\n[access]\nmh_prefixes = [\"10.2.0.0/24\"]\n";
    let c = MsrdConfig::from_str(
        &format!("{base}[[cell]]\ninterface = \"cell0\"\n"),
        "msrd.toml",
    )
    .unwrap();
    assert!(c.beacon.enabled);
    assert_eq!(
        (c.beacon.interval_ms, c.beacon.lifetime_ms, c.beacon.port),
        (1000, 3000, 4345)
    );
    assert_eq!(c.beacon_interfaces(), vec!["cell0".to_string()]);
    let e = MsrdConfig::from_str(
        &format!("{base}[beacon]\ninterval_ms = 2000\nlifetime_ms = 1000\n"),
        "msrd.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("msrd.toml") && e.contains("beacon.lifetime_ms"),
        "{e}"
    );
    let e = MsrdConfig::from_str(
        &format!("{base}[beacon]\nintervall_ms = 2000\n"),
        "msrd.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("intervall_ms"), "{e}");
}

#[test]
fn handoff_section_defaults_peers_and_errors() {
    let c = msrd(MIN).unwrap();
    assert!(!c.handoff.enabled());
    assert_eq!(c.handoff.greet_port, 4346);
    assert_eq!(c.handoff.unacked, UnackedPolicy::Auto);
    let ok = format!(
        "{MIN}\n[handoff]\nlisten = \"10.1.0.11:4347\"\nlan_interface = \"lan0\"\nunacked = \"as_sent\"\n\
         [[handoff.peer]]\nid = \"msr2\"\naddress = \"10.1.0.12:4347\"\nkey = \"{}\"\n",
        "ab".repeat(16)
    );
    let c = msrd(&ok).unwrap();
    assert!(c.handoff.enabled());
    assert_eq!(
        c.handoff.peer("msr2").unwrap().key_bytes().unwrap(),
        vec![0xab; 16]
    );
    assert_eq!(c.handoff.unacked, UnackedPolicy::AsSent);
    let peer = |extra: &str| {
        format!("{MIN}\n[handoff]\nlisten = \"10.1.0.11:4347\"\n[[handoff.peer]]\nid = \"msr2\"\naddress = \"10.1.0.12:4347\"\n{extra}")
    };
    msrd_err(&peer("key = \"abc\""), "handoff.peer[0].key");
    msrd_err(&peer("key = \"abab\""), "handoff.peer[0].key");
    msrd_err(&peer(""), "handoff.peer[0].key");
    msrd_err(
        &peer(&format!("key = \"{}\"\nkey_file = \"/x\"", "ab".repeat(16))),
        "handoff.peer[0].key",
    );
    msrd_err(
        &format!("{MIN}\n[handoff]\n[[handoff.peer]]\nid = \"msr2\"\naddress = \"10.1.0.12:4347\"\nkey = \"{}\"\n", "ab".repeat(16)),
        "handoff.listen",
    );
    msrd_err(
        &format!("[msr]\nid = \"msr2\"\ngateway = [\"10.2.0.1\"]\n[access]\nmh_prefixes = [\"10.2.0.0/24\"]\n[handoff]\nlisten = \"10.1.0.11:4347\"\n[[handoff.peer]]\nid = \"msr2\"\naddress = \"10.1.0.12:4347\"\nkey = \"{}\"\n", "ab".repeat(16)),
        "handoff.peer[0].id",
    );
    msrd_err(
        &format!("{MIN}\n[handoff]\nlan_interface = \"a/b\"\n"),
        "handoff.lan_interface",
    );
}

#[test]
fn handoff_tls_takes_certificates_instead_of_keys() {
    let base = "[msr]\nid = \"msr1\"\ngateway = [\"10.2.0.1\"]\n[access]\nmh_prefixes = [\"10.2.0.0/24\"]\n\
                [handoff]\nlisten = \"10.1.0.11:4347\"\n";
    let tls = "[handoff.tls]\nca = \"/etc/itcp/ca.pem\"\ncert = \"/etc/itcp/msr.pem\"\nkey = \"/etc/itcp/msr.key\"\n";
    let peer = "[[handoff.peer]]\nid = \"msr2\"\naddress = \"10.1.0.12:4347\"\n";
    let c = msrd(&format!("{base}{peer}{tls}")).unwrap();
    let t = c.handoff.tls.as_ref().unwrap();
    assert_eq!(t.ca, std::path::Path::new("/etc/itcp/ca.pem"));
    assert!(t.accept_unlisted);
    // Without TLS the same peer needs a key.
    msrd_err(&format!("{base}{peer}"), "handoff.peer[0].key");
    // With it a key is a mistake, not silently ignored.
    msrd_err(
        &format!("{base}{peer}key = \"{}\"\n{tls}", "ab".repeat(16)),
        "handoff.peer[0].key",
    );
    // Ids must be names a certificate can carry.
    msrd_err(
        &format!("{}{peer}{tls}", base.replace("msr1", "msr_1")),
        "msr.id",
    );
    msrd_err(
        &format!("{base}{}{tls}", peer.replace("msr2", "-msr2")),
        "handoff.peer[0].id",
    );
    msrd_err(
        &format!("{base}{}", tls.replace("/etc/itcp/ca.pem", "")),
        "handoff.tls.ca",
    );
    msrd_err(&format!("{base}{tls}crl = \"x\"\n"), "crl");
}

#[test]
fn metrics_section_defaults_and_errors() {
    let c = msrd(MIN).unwrap();
    assert_eq!(c.metrics, MetricsSection::default());
    assert_eq!(c.metrics.listen, None);
    let c = msrd(&format!("{MIN}\n[metrics]\nlisten = \"10.1.0.11:9473\"\n")).unwrap();
    assert_eq!(c.metrics.listen, Some("10.1.0.11:9473".parse().unwrap()));
    msrd_err(
        &format!("{MIN}\n[metrics]\nlisten = \"10.1.0.11\"\n"),
        "metrics.listen",
    );
    msrd_err(
        &format!("{MIN}\n[metrics]\nlisten = \"10.1.0.11:0\"\n"),
        "metrics.listen",
    );
    msrd_err(&format!("{MIN}\n[metrics]\nport = 9473\n"), "metrics");
    let e = msrd_err(
        &format!("{MIN}\n[metrics]\nlisten = \"10.2.0.1:1080\"\n"),
        "metrics.listen",
    );
    assert!(e.to_string().contains("SOCKS"), "{e}");
    let e = msrd_err(
        &format!("{MIN}\n[metrics]\nlisten = \"0.0.0.0:1080\"\n"),
        "metrics.listen",
    );
    assert!(e.to_string().contains("SOCKS"), "{e}");
    let e = msrd_err(
        &format!("{MIN}\n[handoff]\nlisten = \"10.1.0.11:4347\"\n[metrics]\nlisten = \"10.1.0.11:4347\"\n"),
        "metrics.listen",
    );
    assert!(e.to_string().contains("handoff"), "{e}");
}

#[test]
fn a_cells_hostapd_socket_needs_network_detection() {
    let hand = "[handoff]\nlisten = \"10.1.0.11:4347\"\n";
    let with_mac = MIN.replace("[msr]\n", "[msr]\ngateway_mac = \"02:00:5e:00:01:01\"\n");
    let ap = "hostapd = \"/run/hostapd/wlan0\"\n";
    let net = format!("[[cell]]\ninterface = \"cell0\"\ndetect = \"network\"\n{ap}");
    let c = msrd(&format!("{with_mac}\n{hand}\n{net}")).unwrap();
    assert_eq!(
        c.cells[0].hostapd.as_deref(),
        Some(std::path::Path::new("/run/hostapd/wlan0"))
    );
    let agent = format!("[[cell]]\ninterface = \"cell0\"\n{ap}");
    let e = msrd_err(&format!("{with_mac}\n{hand}\n{agent}"), "needs detect");
    assert_eq!(e.key(), Some("cell[0].hostapd"));
}

#[test]
fn gateway_mac_and_network_detection() {
    let hand = "[handoff]\nlisten = \"10.1.0.11:4347\"\n";
    let net = "[[cell]]\ninterface = \"cell0\"\ndetect = \"network\"\n";
    let c = msrd(&format!(
        "{}\n{hand}\n{net}",
        MIN.replace("[msr]\n", "[msr]\ngateway_mac = \"02:00:5E:00:01:01\"\n")
    ))
    .unwrap();
    assert_eq!(c.msr.gateway_mac(), Some([2, 0, 0x5e, 0, 1, 1]));
    assert_eq!(c.cells[0].detect, crate::Detect::Network);
    assert_eq!(c.handoff.detect_hold_ms, 500);
    assert_eq!(c.handoff.stale_window_ms, 500);
    // Network detection needs the shared MAC and handoff.
    let e = msrd_err(&format!("{MIN}\n{hand}\n{net}"), "gateway_mac");
    assert_eq!(e.key(), Some("cell[0].detect"));
    let with_mac = MIN.replace("[msr]\n", "[msr]\ngateway_mac = \"02:00:5e:00:01:01\"\n");
    let e = msrd_err(&format!("{with_mac}\n{net}"), "needs handoff");
    assert_eq!(e.key(), Some("cell[0].detect"));
    for (bad, why) in [
        ("03:00:5e:00:01:01", "group"),
        ("00:00:00:00:00:00", "not a usable"),
        ("02:00:5e:00:01", "not a MAC address"),
        ("02:00:5e:00:01:01:07", "not a MAC address"),
        ("02-00-5e-00-01-01", "not a MAC address"),
        ("02:00:5e:00:01:zz", "not a MAC address"),
    ] {
        let t = MIN.replace("[msr]\n", &format!("[msr]\ngateway_mac = \"{bad}\"\n"));
        let e = msrd_err(&t, why);
        assert_eq!(e.key(), Some("msr.gateway_mac"), "{bad}");
    }
    let e = msrd_err(
        &format!("{MIN}\n[[cell]]\ninterface = \"cell0\"\ndetect = \"radar\"\n"),
        "radar",
    );
    assert!(
        e.to_string().contains("agent") && e.to_string().contains("network"),
        "{e}"
    );
    let e = msrd_err(
        &format!("{MIN}\n{hand}detect_hold_ms = 5\n"),
        "detect_hold_ms",
    );
    assert_eq!(e.key(), Some("handoff.detect_hold_ms"));
    let e = msrd_err(
        &format!("{MIN}\n{hand}stale_window_ms = 60000\n"),
        "stale_window_ms",
    );
    assert_eq!(e.key(), Some("handoff.stale_window_ms"));
}
