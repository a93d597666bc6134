//! `msrd`: the I-TCP mobility support router daemon.
//!
//! ```text
//! msrd --config /etc/itcp/msrd.toml
//! msrd --check-config /etc/itcp/msrd.toml
//! ```
//! The command line is the table [`SPEC`] (also `--help` and the man page).

use std::process::ExitCode;

use itcp_cli::{Arg, Args, Flag, Section, Spec};
use itcp_config::MsrdConfig;

static SPEC: Spec = Spec {
    name: "msrd",
    version: env!("CARGO_PKG_VERSION"),
    about: "the I-TCP mobility support router daemon",
    synopsis: &["--config FILE", "--check-config FILE"],
    description: "\
msrd runs on each mobility support router (MSR) of an I-TCP network. It is the SOCKS5
gateway of the mobile hosts (MHs) in its cells: every connection of an MH to a fixed
host is split in two at the MSR, a wireless part (MH to MSR) and a fixed part (MSR to
fixed host), and msrd relays between them. When an MH moves to another cell, the new
MSR's msrd fetches the MH's connections, with their TCP state and queued bytes, from the
old one (TCP_REPAIR), so they survive the move without the fixed host noticing.

msrd also announces its cells with beacons, can intercept the MHs' unmodified TCP
connections transparently (nftables and TPROXY), answers itcpctl(1) on a control socket
and records every handoff in a log.

It runs in the foreground and logs to stderr (text or JSON, [msr] log_format).",
    flags: &[
        Flag::value(
            "config",
            "FILE",
            "Run with the configuration in FILE (TOML; see /etc/itcp/msrd.toml for every key \
             and its default).",
        ),
        Flag::value(
            "check-config",
            "FILE",
            "Only read and validate FILE, print 'FILE: ok' and exit: 0 if it is valid, 1 with \
             the file and the key at fault otherwise.",
        ),
    ],
    commands: &[],
    sections: &[
        Section {
            title: "SIGNALS",
            body: "SIGTERM and SIGINT drain: msrd accepts no new connection and gives the open \
                   ones [relay] drain_timeout_ms to finish, then removes its interception rules \
                   and exits. SIGUSR2 upgrades (see UPGRADES; the outcome is logged).",
        },
        Section {
            title: "UPGRADES",
            body: "\
itcpctl upgrade (or SIGUSR2, or systemctl reload msrd) replaces a running msrd by a
new process of its binary, as installed now at the path msrd was started from, with
the same arguments. The new process loads the configuration and takes over every
listening socket, every relayed connection with the bytes in transit, every MH
listener with the connections it accepted, and the handoff state (tokens, holds);
the router's interception rules, policy route and proxy ARP entries stay as they
are. The old process then exits without undoing them. No connection is reset and no
byte is lost; relays pause for a few milliseconds.

If the new process cannot take over (its configuration does not load, it changes a
listening socket or the interception rules, it exits, or it is not ready within 5 s,
or has not adopted the state within 5 s more), it is killed and the old process
serves on as before; itcpctl upgrade says why. Connections still in setup after 2 s
(request handshake, fixed-side connect, a SOCKS BIND waiting for its peer) end with
the old process.",
        },
        Section {
            title: "ENVIRONMENT",
            body: "MSRD_LOG overrides [msr] log_level (error, warn, info, debug, trace, or a \
                   tracing filter). NOTIFY_SOCKET (set by systemd for Type=notify units): msrd \
                   reports READY=1, STOPPING=1 and, when it upgrades, the new process's \
                   MAINPID. MSRD_UPGRADE_FD is set by msrd for the process that takes over from \
                   it; never set it yourself.",
        },
        Section {
            title: "FILES",
            body: "\
  /etc/itcp/msrd.toml                 the configuration (systemd unit msrd.service)
  /etc/itcp/msrd-transparent.toml     an example with transparent interception
  /run/msrd/control.sock              the control socket ([msr] control_socket)
  /var/log/itcp/handoffs.jsonl        the handoff log ([handoff] log_file)",
        },
        Section {
            title: "EXIT STATUS",
            body: "0 after a clean shutdown, an upgrade (the new process serves) or a valid \
                   --check-config; 1 when the configuration is invalid or the daemon fails; 2 \
                   on a usage error.",
        },
        Section {
            title: "EXAMPLES",
            body: "\
  msrd --check-config /etc/itcp/msrd.toml
  systemctl enable --now msrd
  systemctl reload msrd               # upgrade in place (itcpctl upgrade)",
        },
        Section {
            title: "SEE ALSO",
            body: "itcpctl(1), itcp-mh-agent(1)",
        },
    ],
};

/// What the command line asks for.
#[derive(Debug, PartialEq)]
enum Mode {
    Run(String),
    Check(String),
}

fn parse(mut a: Args) -> itcp_cli::Result<Mode> {
    let mut mode = None;
    while let Some(arg) = a.next()? {
        let m = match arg {
            Arg::Flag("config") => Mode::Run(a.value("config")?),
            Arg::Flag("check-config") => Mode::Check(a.value("check-config")?),
            other => return Err(a.unexpected(other)),
        };
        if mode.is_some() {
            return Err(a.usage("give one of --config and --check-config, once"));
        }
        mode = Some(m);
    }
    mode.ok_or_else(|| a.usage("--config FILE or --check-config FILE is required"))
}

fn main() -> ExitCode {
    itcp_proxy::upgrade::remember_invocation();
    let (check, path) = match parse(Args::from_env(&SPEC)) {
        Ok(Mode::Run(p)) => (false, p),
        Ok(Mode::Check(p)) => (true, p),
        Err(stop) => return itcp_cli::exit(&SPEC, stop),
    };
    // Started by a running msrd to take over from it (upgrade)?
    let adopt = match itcp_proxy::upgrade::take_inherited() {
        Some(Err(e)) => {
            eprintln!("msrd: {e}");
            return ExitCode::FAILURE;
        }
        Some(Ok(fd)) if !check => Some(fd),
        _ => None,
    };
    let cfg = match MsrdConfig::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("msrd: {e}");
            if let Some(fd) = &adopt {
                itcp_proxy::upgrade::refuse(fd, &e.to_string());
            }
            return ExitCode::FAILURE;
        }
    };
    if check {
        // The channel's certificates and key are files of their own: read them too.
        if let Some(t) = &cfg.handoff.tls {
            if let Err(e) = itcp_proxy::handoff::tls::ChannelTlsConfig::load(t, &cfg.msr.id) {
                eprintln!("msrd: {path}: {e}");
                return ExitCode::FAILURE;
            }
        }
        println!("{path}: ok");
        return ExitCode::SUCCESS;
    }
    if let Err(e) = itcp_proxy::logging::init(&cfg) {
        eprintln!("msrd: {e}");
        if let Some(fd) = &adopt {
            itcp_proxy::upgrade::refuse(fd, &e.to_string());
        }
        return ExitCode::from(2);
    }
    match itcp_proxy::run::run(cfg, adopt) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("msrd: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> itcp_cli::Result<Mode> {
        parse(Args::new(&SPEC, a.iter().copied()))
    }

    #[test]
    fn table_and_parser_agree() {
        itcp_cli::check_table(&SPEC, parse);
        assert_eq!(p(&["--config", "f"]), Ok(Mode::Run("f".into())));
        assert_eq!(p(&["--check-config=f"]), Ok(Mode::Check("f".into())));
        assert!(p(&[]).is_err());
        assert!(p(&["--config", "a", "--check-config", "b"]).is_err());
    }
}
