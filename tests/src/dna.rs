//! The MH's own OS noticing a new attachment, for MHs that run nothing of ours.
//!
//! On link-up, an OS checks that its gateway is still there before it trusts its
//! address (detecting network attachment, RFC 4436 for IPv4; dhcpcd and NetworkManager
//! send an ARP request for the known gateway). Network detection (`detect =
//! "network"`) needs exactly one frame from the MH in the new cell: an MH that is only
//! downloading sends nothing until data reaches it, and the data is still sent into
//! the old cell. The lab stands in for the OS: a thread in the MH's namespace watches
//! air0's carrier (the emulator raises it at each association) and probes the gateway
//! with `arping` at each carrier-up (three requests, 150 ms apart).

use std::io;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use itcp_mh::link::{LinkEvent, LinkWatch};

use crate::sys;

/// The running stand-in. Dropping it stops it.
pub struct Announcer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What the MH's OS sends at each carrier-up.
#[derive(Debug, Clone)]
pub enum Probe {
    /// An ARP request for its gateway, from its own address (RFC 4436).
    Gateway(String),
    /// An ARP probe for its own address, from the unspecified address (RFC 5227, as
    /// a host does before it reuses an address on reassociation): it proves no
    /// address, only the station.
    Own(String),
}

impl Probe {
    fn arping_args(&self, ifname: &str) -> Vec<String> {
        let (dad, target) = match self {
            Probe::Gateway(gw) => (false, gw),
            Probe::Own(addr) => (true, addr),
        };
        let mut a: Vec<String> = ["-q", "-c", "1", "-w", "1", "-I", ifname]
            .map(String::from)
            .into();
        if dad {
            a.push("-D".into());
        }
        a.push(target.clone());
        a
    }
}

impl Announcer {
    /// Watches `ifname` in namespace `netns` and sends `probe` at each carrier-up.
    pub fn start(netns: &str, ifname: &str, probe: Probe) -> io::Result<Announcer> {
        let watch = sys::in_netns(netns, || LinkWatch::open(ifname))?;
        let args = probe.arping_args(ifname);
        let netns = netns.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut watch = watch;
            while !stop2.load(Ordering::Relaxed) {
                let fd = watch.as_fd().as_raw_fd();
                if !sys::poll_readable(&[fd], Some(50_000_000)).is_ok_and(|r| !r.is_empty()) {
                    continue;
                }
                let ups = watch
                    .read()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|e| *e == LinkEvent::Up)
                    .count();
                if ups > 0 {
                    // One request each from three arpings 150 ms apart, not waited
                    // for: the cell loses frames (1 % on the paper's profiles), and
                    // an MH that only downloads sends nothing else until detected,
                    // so a lost probe would leave it unnoticed (RFC 4436 hosts
                    // retransmit too). arping runs in the MH's namespace: a child
                    // of a thread inside it.
                    let (netns, args) = (netns.clone(), args.clone());
                    std::thread::spawn(move || {
                        let mut children = Vec::new();
                        for k in 0..3 {
                            if k > 0 {
                                std::thread::sleep(std::time::Duration::from_millis(150));
                            }
                            children.extend(sys::in_netns(&netns, || {
                                Command::new("arping")
                                    .args(&args)
                                    .stdout(Stdio::null())
                                    .stderr(Stdio::null())
                                    .spawn()
                            }));
                        }
                        for mut c in children {
                            let _ = c.wait();
                        }
                    });
                }
            }
        });
        Ok(Announcer {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Announcer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
