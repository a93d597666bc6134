//! The regular-TCP baseline: MSRs are plain routers, and the network reroutes the MH's
//! address to the new MSR the way Mobile IP would once the MH hears that MSR.
//!
//! Each MSR broadcasts an agent advertisement (beacon) into its cell every
//! `beacon_interval`; the emulator delivers it only while the MH is in that cell. An
//! agent listening in the MH's namespace detects movement with mh-lib's detector (eager:
//! the first beacon of an MSR it had not been hearing) and, after `registration_delay`
//! (the registration round
//! trip to a home agent), moves the GW's host route for the MH and the MH's default
//! gateway entry to the new MSR. Those two route changes stand in for the Mobile-IP
//! tunnel; the links, losses and timing are the very ones I-TCP is measured on.
//!
//! With [`MobileIpOpts::solicit`] the MH does not wait for the next advertisement, as
//! the I-TCP agent does not (docs/architecture.md §7): when its air0 gets carrier (it joined a
//! cell; mh-lib's [`LinkWatch`] over rtnetlink) it broadcasts a solicitation to
//! [`SOLICIT_PORT`] at once and twice more 20 ms apart until an advertisement arrives
//! (mh-lib's [`Solicitor`]), and each MSR answers one heard on its cell with its
//! advertisement at once, rate-limited per source as msrd does. Mobile IP agent
//! solicitation (RFC 5944 §2.2) works the same way.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::lab::{addr, reroute, Host, Lab};
use crate::sys;
use itcp_handoff::greet::PerAddr;
use itcp_mh::link::{LinkEvent, LinkWatch};
use itcp_mh::mobility::{Beacon, Decision, Detector, Policy, Solicitor};
use itcp_proto::beacon::Solicitation;

/// UDP port of the baseline's agent advertisements.
pub const BEACON_PORT: u16 = 4344;
/// UDP port the baseline's MSRs hear solicitations on.
pub const SOLICIT_PORT: u16 = 4343;

#[derive(Debug, Clone)]
pub struct MobileIpOpts {
    pub beacon_interval: Duration,
    /// Movement detection (eager: first beacon of a new MSR; lazy: the current one's
    /// advertisement, 3 beacon intervals, expired).
    pub policy: Policy,
    /// Delay between hearing the new MSR and the reroute taking effect.
    pub registration_delay: Duration,
    /// Solicit an advertisement when the MH's link comes up (see the module docs);
    /// false: wait for the periodic ones.
    pub solicit: bool,
}

impl Default for MobileIpOpts {
    fn default() -> Self {
        Self {
            beacon_interval: Duration::from_secs(1),
            policy: Policy::Eager,
            registration_delay: Duration::ZERO,
            solicit: false,
        }
    }
}

/// One registration: when the MH heard the new MSR, and when routes pointed at it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Registration {
    pub msr: usize,
    pub heard_ns: u64,
    pub routed_ns: u64,
}

/// The running baseline agents. Dropping it stops them.
pub struct MobileIp {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    registrations: Arc<Mutex<Vec<Registration>>>,
}

impl MobileIp {
    pub fn start(lab: &Lab, opts: MobileIpOpts) -> io::Result<MobileIp> {
        let stop = Arc::new(AtomicBool::new(false));
        let registrations = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        let listen = sys::in_netns(&lab.ns(Host::Mh), || {
            UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], BEACON_PORT)))
        })?;
        listen.set_nonblocking(true)?;
        // The MH's side of solicitation: air0's carrier, and a broadcast socket on air0.
        let soliciting = if opts.solicit {
            Some(sys::in_netns(&lab.ns(Host::Mh), || {
                let w = LinkWatch::open("air0")?;
                let s = UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))?;
                s.set_broadcast(true)?;
                bind_to_device(&s, "air0")?;
                Ok((w, s))
            })?)
        } else {
            None
        };
        for k in 1..=lab.msrs() {
            let (sock, heard) = sys::in_netns(&lab.ns(Host::Msr(k)), || {
                let s = UdpSocket::bind(SocketAddr::from((addr::CELL_GW, 0)))?;
                s.set_broadcast(true)?;
                // Solicitations from the cell (broadcast to SOLICIT_PORT).
                let h = UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], SOLICIT_PORT)))?;
                bind_to_device(&h, "cell0")?;
                h.set_nonblocking(true)?;
                Ok((s, h))
            })?;
            let interval = opts.beacon_interval;
            // Each MSR beacons at its own seeded phase of the wall clock, exactly as msrd
            // does with the same `[beacon] offset_ms` in I-TCP runs (lab::beacon_offset_ms).
            let phase = crate::lab::until_wall_aligned(
                interval.as_millis() as u64,
                crate::lab::beacon_offset_ms(lab.config.seed, k),
            );
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                let dst = SocketAddr::from(([10, 2, 0, 255], BEACON_PORT));
                let msg = format!("MIP-ADV msr={k}");
                let mut next = sys::mono_ns() + phase.as_nanos() as u64;
                // As msrd: 4 answers at once per source, then 2 per second.
                let mut limit = PerAddr::new(4, 2.0, 4096);
                let mut buf = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    let now = sys::mono_ns();
                    if now >= next {
                        let _ = sock.send_to(msg.as_bytes(), dst);
                        next += interval.as_nanos() as u64;
                    }
                    let wait = next.saturating_sub(sys::mono_ns()).min(50_000_000);
                    if sys::poll_readable(&[heard.as_raw_fd()], Some(wait))
                        .is_ok_and(|r| !r.is_empty())
                    {
                        while let Ok((n, from)) = heard.recv_from(&mut buf) {
                            let answer = Solicitation::parse(&buf[..n]).is_ok()
                                && limit.allow(&from.ip(), sys::mono_ns() / 1_000_000);
                            if answer {
                                let _ = sock.send_to(msg.as_bytes(), dst);
                            }
                        }
                    }
                }
            }));
        }
        let (gw, mh) = (lab.ns(Host::Gw), lab.ns(Host::Mh));
        let first = lab.config.initial_cells.first().copied().unwrap_or(1);
        let regs = registrations.clone();
        let stop2 = stop.clone();
        threads.push(std::thread::spawn(move || {
            // The same movement detection as the I-TCP agent (mh-lib), with no
            // hysteresis: a Mobile-IP MH registers as soon as it decides to move.
            let mut det = Detector::new(opts.policy, opts.beacon_interval, Duration::ZERO);
            let lifetime_ms = 3 * opts.beacon_interval.as_millis() as u64;
            let mut soliciting = soliciting;
            // As the I-TCP agent: 3 solicitations 20 ms apart per link-up.
            let mut solicitor = Solicitor::new(2, Duration::from_millis(20));
            let mut buf = [0u8; 256];
            while !stop2.load(Ordering::Relaxed) {
                let mut fds = vec![listen.as_raw_fd()];
                fds.extend(soliciting.as_ref().map(|(w, _)| w.as_fd().as_raw_fd()));
                let now = sys::mono_ns();
                let wait = solicitor
                    .next_due()
                    .map_or(50_000_000, |t| t.saturating_sub(now).min(50_000_000));
                let _ = sys::poll_readable(&fds, Some(wait));
                if let Some((w, s)) = &mut soliciting {
                    for ev in w.read().unwrap_or_default() {
                        match ev {
                            LinkEvent::Up => solicitor.link_up(sys::mono_ns()),
                            LinkEvent::Down => {
                                solicitor.link_down();
                                det.link_lost();
                            }
                        }
                    }
                    if let Some(seq) = solicitor.poll(sys::mono_ns()) {
                        let dst = SocketAddr::from(([255, 255, 255, 255], SOLICIT_PORT));
                        let _ = s.send_to(&Solicitation::new(seq).to_bytes(), dst);
                    }
                }
                let heard = sys::mono_ns();
                let decision = match listen.recv(&mut buf) {
                    Ok(n) => {
                        let heard = sys::mono_ns();
                        solicitor.on_beacon();
                        let Some(msr) = std::str::from_utf8(&buf[..n])
                            .ok()
                            .and_then(|s| s.strip_prefix("MIP-ADV msr="))
                            .and_then(|s| s.parse::<usize>().ok())
                        else {
                            continue;
                        };
                        let beacon = Beacon {
                            msr: msr.to_string(),
                            mac: addr::msr_cell_mac(msr),
                            lifetime_ms,
                            seq: 0,
                        };
                        det.on_beacon(heard, &beacon)
                    }
                    // Nothing heard: advertisements may have expired (lazy moves).
                    Err(_) => det.on_tick(heard),
                };
                if let Some(Decision::Move { from, to }) = decision {
                    let to: usize = to.parse().expect("MSR numbers");
                    // The first beacon only attaches to the MSR the routes already use.
                    if from.is_none() && to == first {
                        continue;
                    }
                    std::thread::sleep(opts.registration_delay);
                    if reroute(&gw, &mh, to).is_ok() {
                        regs.lock().unwrap().push(Registration {
                            msr: to,
                            heard_ns: heard,
                            routed_ns: sys::mono_ns(),
                        });
                    }
                }
            }
        }));
        Ok(MobileIp {
            stop,
            threads,
            registrations,
        })
    }

    pub fn registrations(&self) -> Vec<Registration> {
        self.registrations.lock().unwrap().clone()
    }
}

fn bind_to_device(s: &UdpSocket, ifname: &str) -> io::Result<()> {
    // SAFETY: the name bytes are valid for their length.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            ifname.as_ptr().cast(),
            ifname.len() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("bind to {ifname}: {e}")));
    }
    Ok(())
}

impl Drop for MobileIp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
