//! `airlink`: the testbed's user-space link emulator.
//!
//! One single-threaded process holds a TAP device per emulated port (created inside the
//! namespaces of the lab), runs the sans-IO [`itcp_testbed::emu::Emulator`] on
//! CLOCK_MONOTONIC with a precise ppoll timer, and answers JSON-line requests on a Unix
//! control socket. Usage:
//!
//! ```text
//! airlink --config TOPOLOGY.json --control /path/to/control.sock
//! ```
//!
//! It prints `ready` on stdout once every device exists and the control socket listens.
//! Link parameters may name `"trace_file": "PATH"` (mahimahi format) instead of
//! `trace_ms`.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::ExitCode;

use itcp_cli::{Arg, Args, Flag, Section, Spec};
use itcp_testbed::emu::{parse_mac, Emulator, Reply, ReplyBody, Request, Topology};
use itcp_testbed::sys;

static SPEC: Spec = Spec {
    name: "airlink",
    version: env!("CARGO_PKG_VERSION"),
    about: "the I-TCP testbed's user-space link emulator",
    synopsis: &["--config TOPOLOGY.json --control SOCKET [--priority fifo|normal]"],
    description: "\
airlink holds one TAP device per emulated port, created in the network namespaces of a
testbed lab (itcp-lab(1) starts it), and carries frames between them through emulated
links and cells: bandwidth, delay, loss models, bandwidth traces (mahimahi format, with
\"trace_file\": PATH), and cell association of the mobile host. An MH's TAP device has
carrier while the MH is in at least one cell and none while it is in no cell, as a
wireless NIC reports association; a move straight from one cell into another drops
the carrier and raises it again at once (a new association).

It prints 'ready' on stdout once every device exists and the control socket listens,
then answers JSON-line requests on the control socket (itcp-lab ctl). It dies with its
parent process.",
    flags: &[
        Flag::value(
            "config",
            "TOPOLOGY.json",
            "The topology: ports (namespace, interface, MAC), links and cells (required).",
        ),
        Flag::value(
            "control",
            "SOCKET",
            "Where to listen for control requests, a Unix socket path (required).",
        ),
        Flag::value(
            "priority",
            "fifo|normal",
            "fifo (default): run SCHED_FIFO, so that frames leave on time on a busy \
             machine; normal: an ordinary process, so that the hosts' daemons are not \
             preempted by the work done in the emulator's context (the receiving \
             namespace's kernel processes each frame as it is written).",
        ),
    ],
    commands: &[],
    sections: &[
        Section {
            title: "EXIT STATUS",
            body: "1 when the topology is invalid or a device cannot be created, 2 on a usage \
                   error; otherwise it runs until killed.",
        },
        Section {
            title: "SEE ALSO",
            body: "itcp-lab(1), ttcp(1)",
        },
    ],
};

fn parse(mut a: Args) -> itcp_cli::Result<(String, String, bool)> {
    let (mut config, mut control, mut fifo) = (None, None, true);
    while let Some(arg) = a.next()? {
        match arg {
            Arg::Flag("config") => config = Some(a.value("config")?),
            Arg::Flag("control") => control = Some(a.value("control")?),
            Arg::Flag("priority") => {
                fifo = match a.value("priority")?.as_str() {
                    "fifo" => true,
                    "normal" => false,
                    v => return Err(a.usage(format!("--priority: {v:?} is not fifo or normal"))),
                }
            }
            other => return Err(a.unexpected(other)),
        }
    }
    match (config, control) {
        (Some(c), Some(s)) => Ok((c, s, fifo)),
        _ => Err(a.usage("--config and --control are required")),
    }
}

fn main() -> ExitCode {
    let (config, control, fifo) = match parse(Args::from_env(&SPEC)) {
        Ok(a) => a,
        Err(stop) => return itcp_cli::exit(&SPEC, stop),
    };
    match run(config, control, fifo) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlink: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Client {
    stream: UnixStream,
    buf: Vec<u8>,
}

fn run(config: String, control: String, fifo: bool) -> Result<(), String> {
    // The lab owns us: if it dies, so do we (and with us every TAP device).
    sys::die_with_parent(libc::SIGKILL);
    sys::set_fine_timer_slack();
    if let Err(e) = fifo.then(sys::set_realtime).transpose() {
        eprintln!("airlink: SCHED_FIFO refused ({e}): frames may be late on a busy machine");
    }

    let text = std::fs::read_to_string(&config).map_err(|e| format!("{config}: {e}"))?;
    let mut topo: Topology = serde_json::from_str(&text).map_err(|e| format!("{config}: {e}"))?;
    topo.load_trace_files()
        .map_err(|e| format!("{config}: {e}"))?;
    let mut emu = Emulator::new(&topo, sys::mono_ns()).map_err(|e| format!("{config}: {e}"))?;

    let mut taps: Vec<OwnedFd> = Vec::new();
    for p in &topo.ports {
        let mac = p.mac.as_deref().map(parse_mac).transpose()?;
        let fd = sys::in_netns(&p.netns, || {
            let fd = sys::open_tap(&p.ifname)?;
            if let Some(mac) = mac {
                sys::set_mac(&p.ifname, mac)?;
            }
            Ok(fd)
        })
        .map_err(|e| format!("port {}: {e}", p.name))?;
        taps.push(fd);
    }
    // Each MH's carrier as its initial association says.
    apply_carrier(&mut emu, &taps);
    let _ = std::fs::remove_file(&control);
    let listener = UnixListener::bind(&control).map_err(|e| format!("{control}: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    println!("ready");
    std::io::stdout().flush().ok();

    let mut clients: Vec<Client> = Vec::new();
    let mut frame = vec![0u8; 65536];
    let mut out = Vec::new();
    let mut write_errors = 0u64;
    loop {
        let now = sys::mono_ns();
        emu.advance(now, &mut out);
        apply_carrier(&mut emu, &taps);
        for (port, f) in out.drain(..) {
            if sys::write_frame(taps[port].as_raw_fd(), &f).is_err() {
                // EIO while the interface is down: the frame is lost like on a dead link.
                write_errors += 1;
            }
        }
        let timeout = emu.next_event().map(|t| t.saturating_sub(sys::mono_ns()));
        if timeout == Some(0) {
            continue;
        }
        let mut fds: Vec<i32> = taps.iter().map(|t| t.as_raw_fd()).collect();
        fds.push(listener.as_raw_fd());
        fds.extend(clients.iter().map(|c| c.stream.as_raw_fd()));
        let ready = sys::poll_readable(&fds, timeout).map_err(|e| format!("ppoll: {e}"))?;
        let mut closed = Vec::new();
        for i in ready {
            if i < taps.len() {
                // Drain the device: a burst may be waiting.
                while let Some(n) =
                    sys::read_nb(taps[i].as_raw_fd(), &mut frame).map_err(|e| e.to_string())?
                {
                    emu.ingress(sys::mono_ns(), i, frame[..n].to_vec());
                }
            } else if i == taps.len() {
                while let Ok((s, _)) = listener.accept() {
                    clients.push(Client {
                        stream: s,
                        buf: Vec::new(),
                    });
                }
            } else {
                let c = &mut clients[i - taps.len() - 1];
                let mut chunk = [0u8; 4096];
                match c.stream.read(&mut chunk) {
                    Ok(0) | Err(_) => closed.push(i - taps.len() - 1),
                    Ok(n) => {
                        c.buf.extend_from_slice(&chunk[..n]);
                        while let Some(pos) = c.buf.iter().position(|&b| b == b'\n') {
                            let line: Vec<u8> = c.buf.drain(..=pos).collect();
                            let reply = answer(&mut emu, &line, write_errors);
                            apply_carrier(&mut emu, &taps);
                            let mut w = serde_json::to_vec(&reply).expect("replies serialize");
                            w.push(b'\n');
                            if c.stream.write_all(&w).is_err() {
                                closed.push(i - taps.len() - 1);
                                break;
                            }
                        }
                    }
                }
            }
        }
        closed.sort_unstable();
        closed.dedup();
        for i in closed.into_iter().rev() {
            clients.remove(i);
        }
    }
}

/// Sets the carrier changes the emulator recorded on the MHs' TAP devices, at once:
/// association changes reach the MH the way a NIC reports them. A failure is logged
/// (the frames still follow the association).
fn apply_carrier(emu: &mut Emulator, taps: &[OwnedFd]) {
    for (port, on) in emu.take_carrier_changes() {
        if let Err(e) = sys::set_carrier(taps[port].as_raw_fd(), on) {
            eprintln!("airlink: port {}: {e}", emu.port_names()[port]);
        }
    }
}

fn answer(emu: &mut Emulator, line: &[u8], write_errors: u64) -> Reply {
    let line = String::from_utf8_lossy(line);
    let mut req = match Request::parse(&line) {
        Ok(r) => r,
        Err(e) => return Reply::error(e),
    };
    if let Err(e) = req.load_trace_files() {
        return Reply::error(e);
    }
    let mut reply = emu.handle(sys::mono_ns(), req);
    if let ReplyBody::Counters(c) = &mut reply.body {
        c.write_errors = write_errors;
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_parser_agree() {
        itcp_cli::check_table(&SPEC, parse);
        let p = |a: &[&str]| parse(Args::new(&SPEC, a.iter().copied()));
        assert_eq!(
            p(&["--config", "t.json", "--control", "c.sock"]),
            Ok(("t.json".into(), "c.sock".into(), true))
        );
        assert_eq!(
            p(&["--config", "t", "--control", "c", "--priority", "normal"]),
            Ok(("t".into(), "c".into(), false))
        );
        assert!(p(&["--config", "t", "--control", "c", "--priority", "rt"]).is_err());
        assert!(p(&["--config", "t.json"]).is_err());
        assert!(p(&["--config", "t.json", "--control", "c", "--bogus"]).is_err());
    }
}
