//! The lab: the topology of docs/architecture.md §1 built from network namespaces.
//!
//! ```text
//!  FH ─wan0═══(airlink: WAN)═══wan0─ GW ─br0─┬─veth─ lan0 MSR1 cell0 ═╗
//!                                            └─veth─ lan0 MSR2 cell0 ═╬═(airlink: air)═ air0 MH
//! ```
//!
//! A lab may have several MHs ([`Lab::with_mhs`]): namespaces `mh`, `mh2`, `mh3`, …,
//! each with its own address ([`addr::mh`]), MAC, session token and mobility agent, all
//! in the same air (each with links of its own in every cell; see [`crate::emu`]).
//!
//! Every namespace name starts with `itcp-<pid>-<seq>-`, so concurrent labs never clash
//! and a later run can tell a dead run's leftovers from a live one's. A [`Lab`] removes
//! everything it made when dropped (also while a test panics), on SIGINT/SIGTERM/SIGHUP
//! (a handler cleans every live lab of the process, then exits), and processes it starts
//! die with it (PR_SET_PDEATHSIG). After a SIGKILL the next lab, or `itcp-lab cleanup`,
//! sweeps namespaces whose owner process is gone.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use serde_json::Value;

use itcp_proto::control;

use crate::emu::{
    AirSpec, CellSpec, CountersReply, LinkParams, PortSpec, Reply, ReplyBody, Request, StatusReply,
    Topology, WireSpec,
};
use crate::msrd_user::MsrdUser;
use crate::sys;

/// Prefix of every namespace a lab creates.
pub const NS_PREFIX: &str = "itcp-";

/// The MAC addresses of the FH's and the GW's ends of the emulated WAN.
const WAN_FH_MAC: &str = "02:00:00:00:f0:01";
const WAN_GW_MAC: &str = "02:00:00:00:f0:02";

/// Addresses of the lab (IPv4; the code above the lab is family-agnostic).
pub mod addr {
    use std::net::Ipv4Addr;
    pub const FH: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    pub const GW_WAN: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    pub const GW_LAN: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
    /// The gateway address every MSR owns on its cell interface.
    pub const CELL_GW: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 1);
    /// The mobile host's one address (MH 1's, in a lab of several MHs).
    pub const MH: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 100);
    /// MH j's address (1-based): 10.2.0.(99+j), so MH 1 is [`MH`].
    pub fn mh(j: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 2, 0, 99 + j as u8)
    }
    /// MH j's MAC address (1-based): MH 1's is [`MH_MAC`].
    pub fn mh_mac(j: usize) -> String {
        format!("02:00:00:00:00:{:02x}", 99 + j)
    }
    /// MSR k's fixed-LAN address (k is 1-based).
    pub fn msr_lan(k: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 1, 0, 10 + k as u8)
    }
    /// MSR k's cell MAC address.
    pub fn msr_cell_mac(k: usize) -> String {
        format!("02:00:00:00:{k:02x}:01")
    }
    pub const MH_MAC: &str = "02:00:00:00:00:64";
    /// The gateway MAC every MSR's cell takes with network detection
    /// ([`crate::lab::Lab::start_itcp_network`]): VRRP's virtual MAC for router 1.
    pub const GATEWAY_MAC: &str = "00:00:5e:00:01:01";
}

/// The lab's IPv6 addresses ([`LabConfig::ipv6`]): the IPv4 plan with 2001:db8::/64
/// (WAN), 2001:db8:1::/64 (fixed LAN), 2001:db8:2::/64 (cells).
pub mod addr6 {
    use std::net::Ipv6Addr;
    pub const FH: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
    pub const GW_WAN: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
    pub const GW_LAN: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
    /// The gateway address every MSR owns on its cell interface.
    pub const CELL_GW: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 1);
    /// The cells' prefix.
    pub const CELLS: &str = "2001:db8:2::/64";
    /// MH j's address (1-based): 2001:db8:2::X with X = 99 + j as a 16-bit group, so MH 1
    /// is 2001:db8:2::64 ([`MH`]).
    pub fn mh(j: usize) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 99 + j as u16)
    }
    pub const MH: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 100);
    /// MSR k's fixed-LAN address.
    pub fn msr_lan(k: usize) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 10 + k as u16)
    }
}

/// A host of the lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    Fh,
    Gw,
    /// MSR k, 1-based.
    Msr(usize),
    /// The MH (MH 1 in a lab of several MHs).
    Mh,
    /// MH j of a lab with several MHs (1-based, j ≥ 2; [`Host::mh`] picks the variant).
    MhN(usize),
}

impl Host {
    /// MH j (1-based): [`Host::Mh`] for 1, [`Host::MhN`] for the others.
    pub fn mh(j: usize) -> Host {
        if j <= 1 {
            Host::Mh
        } else {
            Host::MhN(j)
        }
    }

    fn suffix(self) -> String {
        match self {
            Host::Fh => "fh".into(),
            Host::Gw => "gw".into(),
            Host::Msr(k) => format!("msr{k}"),
            Host::Mh | Host::MhN(1) => "mh".into(),
            Host::MhN(j) => format!("mh{j}"),
        }
    }

    /// Which MH this is (1-based), if it is one.
    pub fn mh_index(self) -> Option<usize> {
        match self {
            Host::Mh => Some(1),
            Host::MhN(j) => Some(j.max(1)),
            _ => None,
        }
    }
}

/// The names people use: FH, GW, MSR1, MH (MH2, … in a lab of several MHs).
impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Fh => f.write_str("FH"),
            Host::Gw => f.write_str("GW"),
            Host::Msr(k) => write!(f, "MSR{k}"),
            Host::Mh | Host::MhN(1) => f.write_str("MH"),
            Host::MhN(j) => write!(f, "MH{j}"),
        }
    }
}

/// Whether the labs this process makes run their emulator SCHED_FIFO (the default; see
/// [`set_airlink_fifo`]).
static AIRLINK_FIFO: AtomicBool = AtomicBool::new(true);

/// Chooses the emulator's priority for the labs this process makes from now on. FIFO
/// keeps the links' timing on a busy machine (the tests' default); but the receiving
/// namespace's kernel handles each frame in the emulator's context, so at FIFO the
/// emulated hosts' TCP work preempts the daemons under test, which on a real network
/// would run on other machines. Benchmarks of msrd's own work may prefer `false`.
pub fn set_airlink_fifo(on: bool) {
    AIRLINK_FIFO.store(on, Ordering::Relaxed);
}

/// What to build.
#[derive(Debug, Clone)]
pub struct LabConfig {
    /// Number of MSRs (cells), ≥ 1.
    pub msrs: usize,
    /// Seed of every random loss decision in the emulator.
    pub seed: u64,
    /// WAN FH→GW ("down") and GW→FH ("up").
    pub wan_down: LinkParams,
    pub wan_up: LinkParams,
    /// Every cell's MSR→MH and MH→MSR links.
    pub cell_down: LinkParams,
    pub cell_up: LinkParams,
    /// Cells the MH is in at start; the MH's routes point at the first.
    pub initial_cells: Vec<usize>,
    /// Plain veth pairs instead of emulated links (FH–GW and MSR1–MH; needs one MSR):
    /// for relay benchmarks at full kernel speed. Such a lab has no emulator.
    pub veth: bool,
    /// IPv6 too ([`addr6`]): every host dual-stack with static addresses, no router
    /// advertisements, no DAD (the air stays quiet, addresses work at once).
    pub ipv6: bool,
}

impl Default for LabConfig {
    fn default() -> Self {
        Self {
            msrs: 2,
            seed: 1,
            wan_down: LinkParams::default(),
            wan_up: LinkParams::default(),
            cell_down: LinkParams::default(),
            cell_up: LinkParams::default(),
            initial_cells: vec![1],
            veth: false,
            ipv6: false,
        }
    }
}

impl LabConfig {
    /// `msrs` MSRs, the same link both ways on the WAN and on every cell, the MH in
    /// cell 1.
    pub fn links(msrs: usize, seed: u64, wan: LinkParams, cell: LinkParams) -> Self {
        Self {
            msrs,
            seed,
            wan_down: wan.clone(),
            wan_up: wan,
            cell_down: cell.clone(),
            cell_up: cell,
            ..Self::default()
        }
    }

    /// Fast, clean links (20 Mbit/s and 2 ms cells, a 100 Mbit/s 1 ms WAN): for tests
    /// about correctness rather than the paper's lossy cells.
    pub fn clean(msrs: usize, seed: u64) -> Self {
        Self::links(
            msrs,
            seed,
            link(100_000_000, 1.0, 0.0),
            link(20_000_000, 2.0, 0.0),
        )
    }
}

/// Link parameters from rate, one-way delay and loss probability.
pub fn link(rate_bps: u64, delay_ms: f64, loss: f64) -> LinkParams {
    use crate::emu::Loss;
    LinkParams {
        rate_bps,
        delay_us: (delay_ms * 1000.0).round() as u64,
        loss: if loss > 0.0 {
            Loss::Bernoulli { p: loss }
        } else {
            Loss::None
        },
        ..Default::default()
    }
}

/// What must be removed: shared with the signal handler.
#[derive(Debug, Clone)]
struct Owned {
    id: String,
    namespaces: Vec<String>,
    dir: PathBuf,
}

static LIVE: Mutex<Vec<Owned>> = Mutex::new(Vec::new());
static SEQ: AtomicU32 = AtomicU32::new(0);
static SIGNALS: Once = Once::new();
static mut SIGNAL_PIPE: [libc::c_int; 2] = [-1, -1];

extern "C" fn on_signal(sig: libc::c_int) {
    let b = sig as u8;
    // SAFETY: write(2) is async-signal-safe; the pipe was set up before the handler.
    unsafe { libc::write(SIGNAL_PIPE[1], (&b as *const u8).cast(), 1) };
}

/// On SIGINT/SIGTERM/SIGHUP: remove every live lab of this process, then exit.
fn install_signal_cleanup() {
    SIGNALS.call_once(|| {
        // SAFETY: runs once, before any handler can fire; the fds live forever.
        unsafe {
            let mut p = [0; 2];
            if libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return;
            }
            SIGNAL_PIPE = p;
        }
        std::thread::spawn(|| {
            let mut b = 0u8;
            // SAFETY: reading one byte from our own pipe.
            let fd = unsafe { SIGNAL_PIPE[0] };
            if unsafe { libc::read(fd, (&mut b as *mut u8).cast(), 1) } == 1 {
                let owned: Vec<Owned> = LIVE.lock().map(|v| v.clone()).unwrap_or_default();
                for o in owned {
                    remove(&o);
                }
                // SAFETY: leaving at once is the point; Drop of other objects is moot.
                unsafe { libc::_exit(128 + b as libc::c_int) };
            }
        });
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: on_signal only calls write(2).
            unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
        }
    });
}

/// Kills every process inside the namespaces, deletes them and the lab's directory.
fn remove(o: &Owned) {
    for ns in &o.namespaces {
        kill_netns_pids(ns);
    }
    for ns in &o.namespaces {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
    // ITCP_LAB_KEEP=1 keeps configs and logs for a post-mortem.
    if std::env::var_os("ITCP_LAB_KEEP").is_some() {
        eprintln!("lab files kept in {}", o.dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&o.dir);
    }
}

/// The processes in network namespace `ns` (none if it cannot be listed). One that
/// has exited and waits to be reaped is not listed: it left its namespaces.
fn netns_pids(ns: &str) -> Vec<i32> {
    let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Whether child `pid` has exited, every thread of it (it may be a zombie: not reaped
/// here, its `Child` may still be waited for), or is no child of ours any more.
fn exited(pid: i32) -> bool {
    // SAFETY: a zeroed siginfo_t for waitid to fill in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid on one pid; WNOWAIT leaves the zombie to be reaped by its owner.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: waitid filled in (or zeroed) the siginfo's pid.
    r != 0 || unsafe { info.si_pid() } == pid
}

fn kill_netns_pids(ns: &str) {
    let pids = netns_pids(ns);
    for &pid in &pids {
        // SAFETY: plain kill of a process that lives in our namespace.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    // Processes we adopted as subreaper (an msrd started by an upgrading msrd) are
    // ours to reap; waitpid on anything else fails at once (ECHILD).
    for pid in pids {
        for _ in 0..200 {
            // SAFETY: waitpid for one specific pid, no status wanted.
            let r = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
            if r != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Namespaces made by labs, grouped by lab id (`itcp-<pid>-<seq>`).
pub fn list_lab_namespaces() -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir("/run/netns") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(rest) = name.strip_prefix(NS_PREFIX) else {
                continue;
            };
            let parts: Vec<&str> = rest.splitn(3, '-').collect();
            if parts.len() == 3 {
                m.entry(format!("{NS_PREFIX}{}-{}", parts[0], parts[1]))
                    .or_default()
                    .push(name);
            }
        }
    }
    m
}

/// Removes namespaces of labs whose process is gone (or all labs with `all`).
/// Returns the lab ids removed.
pub fn sweep(all: bool) -> Vec<String> {
    let mut removed = Vec::new();
    for (id, namespaces) in list_lab_namespaces() {
        let pid: i32 = id[NS_PREFIX.len()..]
            .split('-')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if all || pid == 0 || !sys::pid_alive(pid) {
            remove(&Owned {
                id: id.clone(),
                namespaces,
                dir: std::env::temp_dir().join(&id),
            });
            removed.push(id);
        }
    }
    removed
}

/// Points the GW's host route for the MH and the MH's neighbour entry for the shared
/// gateway address at MSR `k` (namespaces given by name, so agents on other threads can
/// call it).
pub fn reroute(gw_ns: &str, mh_ns: &str, k: usize) -> io::Result<()> {
    reroute_mh(gw_ns, mh_ns, addr::MH, k)
}

/// [`reroute`] for the MH with address `mh`.
pub fn reroute_mh(gw_ns: &str, mh_ns: &str, mh: std::net::Ipv4Addr, k: usize) -> io::Result<()> {
    run_ip(
        Some(gw_ns),
        &format!("route replace {mh}/32 via {}\n", addr::msr_lan(k)),
    )?;
    run_ip(
        Some(mh_ns),
        &format!(
            "neigh replace {} lladdr {} dev air0 nud permanent\n",
            addr::CELL_GW,
            addr::msr_cell_mac(k)
        ),
    )?;
    // The same for IPv6 in a dual-stack lab (MH j's address follows its IPv4 one).
    if ipv6_on(mh_ns) {
        let mh6 = addr6::mh(usize::from(mh.octets()[3]) - 99);
        run_ip(
            Some(gw_ns),
            &format!("route replace {mh6}/128 via {}\n", addr6::msr_lan(k)),
        )?;
        run_ip(
            Some(mh_ns),
            &format!(
                "neigh replace {} lladdr {} dev air0 nud permanent\n",
                addr6::CELL_GW,
                addr::msr_cell_mac(k)
            ),
        )?;
    }
    Ok(())
}

/// True if IPv6 is on in namespace `ns` (a dual-stack lab).
fn ipv6_on(ns: &str) -> bool {
    sys::in_netns(ns, || {
        std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6").map(|v| v.trim() == "0")
    })
    .unwrap_or(false)
}

/// MSR `k`'s beacon phase (ms within each second of the wall clock) for `seed`: the same
/// in regular-TCP and I-TCP runs, so movement detection waits equally long in both.
pub fn beacon_offset_ms(seed: u64, k: usize) -> u64 {
    crate::rng::derive_seed(seed, &format!("beacon{k}")) % 1000
}

/// Time until the next wall-clock instant ≡ `offset_ms` (mod `interval_ms`).
pub fn until_wall_aligned(interval_ms: u64, offset_ms: u64) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let (iv, off) = (
        interval_ms as u128 * 1_000_000,
        offset_ms as u128 * 1_000_000,
    );
    Duration::from_nanos(((off + iv - now % iv) % iv) as u64)
}

/// A running lab. Dropping it tears everything down.
pub struct Lab {
    pub id: String,
    pub config: LabConfig,
    /// Scratch directory for configs, control sockets and logs.
    pub dir: PathBuf,
    airlink: Option<Child>,
    control: PathBuf,
    children: Vec<Child>,
    /// Extra environment of msrd processes: (MSR, name, value).
    msrd_env: Vec<(usize, String, String)>,
    /// Every msrd this lab started: (MSR, pid).
    msrd_pids: Mutex<Vec<(usize, i32)>>,
    /// Lines added to msrd's `[access]` by [`Lab::msrd_config`].
    pub access_extra: String,
    /// Lines added to msrd's `[msr]`, and to its `[[cell]]` for `cell0` (`{MSR}` in
    /// the latter is the MSR's number; [`Lab::start_itcp_network`] adds its own).
    pub msr_extra: String,
    pub cell_extra: String,
    /// msrd's `log_level` in [`Lab::msrd_config`] (`debug`).
    pub msrd_log_level: String,
    /// Lines added to msrd's `[handoff]` by [`Lab::handoff_config`].
    pub handoff_extra: String,
    /// The MSR⇄MSR channel runs over mutual TLS with certificates of a lab CA made by
    /// `scripts/msr-certs` (true); false: a pre-shared key per pair of MSRs.
    pub channel_tls: bool,
    /// msrd beacons at the seeded wall-clock phases of [`beacon_offset_ms`].
    pub beacon_offsets: bool,
    /// The msrd binary [`Lab::start_msrd`] runs (default: [`bin_path`]`("msrd")`).
    pub msrd_bin: Option<PathBuf>,
    /// msrd runs as this user with these capabilities instead of as root (default:
    /// `ITCP_LAB_MSRD_USER`, see [`MsrdUser::from_env`]); it then owns the lab directory.
    pub msrd_user: Option<MsrdUser>,
    /// Number of MHs (1 unless built with [`Lab::with_mhs`]).
    mhs: usize,
    /// This lab's turn ([`Turn`]); dropped last, after the teardown.
    _turn: Turn,
}

/// Labs in one process run one at a time unless [`labs_in_parallel`] was called (the
/// benchmarks' runner does): a test binary runs its tests on both cores, and two labs
/// at once put their hosts' kernels, emulators and msrds on the same two cores, so
/// tests that measure timing (a spurious retransmission at the FH, a handoff's
/// deadline) failed now and then for want of CPU, not of correctness. A thread may
/// hold several labs at once; one that waits longer than [`TURN_WAIT`] (a test that
/// builds labs on several threads) goes ahead anyway.
static PARALLEL: AtomicBool = AtomicBool::new(false);
static TURNS: Mutex<(Option<std::thread::ThreadId>, usize)> = Mutex::new((None, 0));
static TURN_FREED: std::sync::Condvar = std::sync::Condvar::new();
const TURN_WAIT: Duration = Duration::from_secs(600);

/// Lets labs of this process run at the same time (see [`Turn`]).
pub fn labs_in_parallel() {
    PARALLEL.store(true, Ordering::Relaxed);
}

/// A lab's turn to run (see [`PARALLEL`]).
struct Turn(bool);

impl Turn {
    fn take() -> Turn {
        if PARALLEL.load(Ordering::Relaxed) {
            return Turn(false);
        }
        let me = std::thread::current().id();
        let until = Instant::now() + TURN_WAIT;
        let mut t = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        while t.0.is_some_and(|holder| holder != me) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                eprintln!("lab: waited {TURN_WAIT:?} for another lab of this process: going ahead");
                return Turn(false);
            }
            t = TURN_FREED
                .wait_timeout(t, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *t = (Some(me), t.1 + 1);
        Turn(true)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if !self.0 {
            return;
        }
        let mut t = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        t.1 -= 1;
        if t.1 == 0 {
            t.0 = None;
            TURN_FREED.notify_all();
        }
    }
}

/// `ITCP_LAB_PIN_MSRD=1`: MSR `k`'s msrd runs on CPU `(k - 1) % cpus` alone, as if
/// each MSR were a router of its own (a one-core one): the benchmarks then see what
/// one MSR's work overlaps with the other's, which on shared cores it cannot.
fn msrd_cpu(k: usize) -> Option<usize> {
    if std::env::var("ITCP_LAB_PIN_MSRD").ok()? != "1" {
        return None;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Some((k - 1) % cpus)
}

/// Where to find the testbed's binaries: `ITCP_BIN_DIR`, else next to the running
/// executable (or one level up, for `cargo test` binaries in `target/*/deps`).
pub fn bin_path(name: &str) -> PathBuf {
    if let Ok(d) = std::env::var("ITCP_BIN_DIR") {
        return Path::new(&d).join(name);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().unwrap_or(Path::new("."));
    for d in [dir, dir.parent().unwrap_or(dir)] {
        let p = d.join(name);
        if p.exists() {
            return p;
        }
    }
    dir.join(name)
}

fn run_ip(ns: Option<&str>, batch: &str) -> io::Result<()> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    let mut child = cmd
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run ip (iproute2): {e}")))?;
    child.stdin.take().unwrap().write_all(batch.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip {}: {}\ncommands:\n{batch}",
            ns.unwrap_or(""),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Keeps each flow's packets in order across the veth links `devs` of `ns`, as a real
/// link does. A veth hands what it receives to the backlog of the CPU that sent it, so
/// two segments of one socket sent from different CPUs (one ACK from the softirq, the
/// next from the process releasing the socket) can be delivered in the opposite order:
/// seen as an MSR's ACK of the FH's data arriving after its ACK of the FH's FIN, which
/// the FH, closed by then, answers with an RST. Receive packet steering hashes each
/// flow to one CPU's backlog, so one flow's packets stay in order.
fn steer_in_order(ns: &str, devs: &[String]) -> io::Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        return Ok(());
    }
    // /sys/class/net shows the devices of the namespace that mounted it: `ip netns
    // exec` mounts the namespace's own.
    let script: String = devs
        .iter()
        .map(|d| {
            format!(
                "echo {} > /sys/class/net/{d}/queues/rx-0/rps_cpus\n",
                cpu_mask(cpus)
            )
        })
        .collect();
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-ec", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run ip (iproute2): {e}")))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "packet steering in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The first `cpus` CPUs as a kernel CPU bitmap: hex, 32 bits per comma-separated group.
fn cpu_mask(cpus: usize) -> String {
    let mut groups: Vec<String> = (0..cpus.div_ceil(32))
        .map(|g| {
            let bits = (cpus - g * 32).min(32);
            let m = if bits == 32 {
                u32::MAX
            } else {
                (1u32 << bits) - 1
            };
            format!("{m:08x}")
        })
        .collect();
    groups.reverse();
    groups.join(",")
}

fn sysctl(ns: &str, settings: &[(&str, &str)]) -> io::Result<()> {
    sys::in_netns(ns, || {
        for (k, v) in settings {
            let path = format!("/proc/sys/{}", k.replace('.', "/"));
            std::fs::write(&path, v)
                .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
        }
        Ok(())
    })
}

impl Lab {
    /// Builds the lab. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN for namespaces).
    pub fn new(config: LabConfig) -> io::Result<Lab> {
        Lab::with_mhs(config, 1)
    }

    /// Builds a lab with `mhs` mobile hosts (1..=100) sharing the cells: MH j is host
    /// [`Host::mh`]`(j)`, address [`addr::mh`]`(j)`, MAC [`addr::mh_mac`]`(j)`, with links
    /// of its own in every cell (see [`crate::emu`]). All start in `initial_cells`.
    pub fn with_mhs(config: LabConfig, mhs: usize) -> io::Result<Lab> {
        if !(1..=100).contains(&mhs) || (config.veth && mhs != 1) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("mhs must be 1..=100 (1 in a veth lab), got {mhs}"),
            ));
        }
        if config.veth && config.msrs != 1 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a veth lab has exactly one MSR (a veth pair is point to point)",
            ));
        }
        if config.msrs == 0 || config.msrs > 200 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("msrs must be 1..=200, got {}", config.msrs),
            ));
        }
        let turn = Turn::take();
        install_signal_cleanup();
        // Orphans of the lab's processes (the new msrd of an upgrade, once the old one
        // exits) become our children, so that teardown can reap them: no zombie is
        // left for init.
        // SAFETY: prctl on our own process.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        sweep(false);
        let id = format!(
            "{NS_PREFIX}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(&id);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut hosts = vec![Host::Fh, Host::Gw];
        hosts.extend((1..=config.msrs).map(Host::Msr));
        hosts.extend((1..=mhs).map(Host::mh));
        let namespaces: Vec<String> = hosts
            .iter()
            .map(|h| format!("{id}-{}", h.suffix()))
            .collect();
        // Register before creating anything, so a signal mid-build still cleans up.
        LIVE.lock().unwrap().push(Owned {
            id: id.clone(),
            namespaces: namespaces.clone(),
            dir: dir.clone(),
        });
        let mut lab = Lab {
            control: dir.join("airlink.sock"),
            id,
            config,
            dir,
            airlink: None,
            children: Vec::new(),
            msrd_env: Vec::new(),
            msrd_pids: Mutex::new(Vec::new()),
            access_extra: String::new(),
            msr_extra: String::new(),
            cell_extra: String::new(),
            msrd_log_level: "debug".into(),
            handoff_extra: String::new(),
            channel_tls: true,
            beacon_offsets: false,
            msrd_bin: None,
            msrd_user: MsrdUser::from_env()?,
            mhs,
            _turn: turn,
        };
        lab.build(&namespaces)?;
        Ok(lab)
    }

    /// Namespace name of a host.
    pub fn ns(&self, h: Host) -> String {
        format!("{}-{}", self.id, h.suffix())
    }

    pub fn msrs(&self) -> usize {
        self.config.msrs
    }

    /// Number of MHs.
    pub fn mhs(&self) -> usize {
        self.mhs
    }

    fn build(&mut self, namespaces: &[String]) -> io::Result<()> {
        let mut b = String::new();
        for ns in namespaces {
            b += &format!("netns add {ns}\n");
        }
        run_ip(None, &b)?;
        let v6 = if self.config.ipv6 { "0" } else { "1" };
        for ns in namespaces {
            run_ip(Some(ns), "link set lo up\n")?;
            // IPv6 stays off on lab links unless asked for: its router/neighbour chatter
            // would use emulated airtime and skew counters. With it on, addresses are
            // static: no router advertisements, no DAD, no autoconfiguration.
            sysctl(
                ns,
                &[
                    ("net.ipv6.conf.all.disable_ipv6", v6),
                    ("net.ipv6.conf.default.disable_ipv6", v6),
                    ("net.ipv6.conf.all.accept_ra", "0"),
                    ("net.ipv6.conf.default.accept_ra", "0"),
                    ("net.ipv6.conf.all.autoconf", "0"),
                    ("net.ipv6.conf.default.autoconf", "0"),
                    ("net.ipv6.conf.all.dad_transmits", "0"),
                    ("net.ipv6.conf.default.dad_transmits", "0"),
                    ("net.ipv6.conf.all.router_solicitations", "0"),
                    ("net.ipv6.conf.default.router_solicitations", "0"),
                    ("net.ipv4.conf.all.rp_filter", "0"),
                    ("net.ipv4.conf.default.rp_filter", "0"),
                ],
            )?;
        }
        let (gw, n) = (self.ns(Host::Gw), self.config.msrs);
        // Fixed LAN: a bridge in the GW namespace, one veth per MSR.
        let mut b = format!(
            "link add br0 type bridge\nlink set br0 up\naddr add {}/24 dev br0\n",
            addr::GW_LAN
        );
        for k in 1..=n {
            let msr = self.ns(Host::Msr(k));
            b += &format!("link add m{k} type veth peer name lan0 netns {msr}\n");
            b += &format!("link set m{k} master br0 up\n");
        }
        run_ip(Some(&gw), &b)?;
        for k in 1..=n {
            run_ip(
                Some(&self.ns(Host::Msr(k))),
                &format!(
                    "addr add {}/24 dev lan0\nlink set lan0 up\n",
                    addr::msr_lan(k)
                ),
            )?;
        }
        let lan_ends: Vec<String> = (1..=n).map(|k| format!("m{k}")).collect();
        steer_in_order(&gw, &lan_ends)?;
        for k in 1..=n {
            steer_in_order(&self.ns(Host::Msr(k)), &["lan0".to_string()])?;
        }
        if self.config.veth {
            run_ip(
                None,
                &format!(
                    "link add wan0 netns {fh} address {WAN_FH_MAC} type veth peer name wan0 netns {gw} address {WAN_GW_MAC}\n\
                     link add cell0 netns {msr} address {cm} type veth peer name air0 netns {mh} address {mm}\n",
                    fh = self.ns(Host::Fh),
                    gw = self.ns(Host::Gw),
                    msr = self.ns(Host::Msr(1)),
                    mh = self.ns(Host::Mh),
                    cm = addr::msr_cell_mac(1),
                    mm = addr::MH_MAC,
                ),
            )?;
            for (h, dev) in [
                (Host::Fh, "wan0"),
                (Host::Gw, "wan0"),
                (Host::Msr(1), "cell0"),
                (Host::Mh, "air0"),
            ] {
                steer_in_order(&self.ns(h), &[dev.to_string()])?;
            }
        } else {
            self.start_airlink()?;
        }
        // Addresses on the emulated ports, routes, forwarding.
        run_ip(
            Some(&self.ns(Host::Fh)),
            &format!(
                "addr add {}/24 dev wan0\nlink set wan0 up\nroute add default via {}\n",
                addr::FH,
                addr::GW_WAN
            ),
        )?;
        run_ip(
            Some(&gw),
            &format!("addr add {}/24 dev wan0\nlink set wan0 up\n", addr::GW_WAN),
        )?;
        // The emulated WAN stands for routed hops, across which nobody resolves
        // addresses: without fixed neighbours the first packet of a lab waited a whole
        // WAN round trip for ARP (200 ms on the paper's WAN), which counted against
        // whichever connection opened first (an MH-opened I-TCP connection's start).
        run_ip(
            Some(&self.ns(Host::Fh)),
            &format!(
                "neigh replace {} lladdr {WAN_GW_MAC} dev wan0 nud permanent\n",
                addr::GW_WAN
            ),
        )?;
        run_ip(
            Some(&gw),
            &format!(
                "neigh replace {} lladdr {WAN_FH_MAC} dev wan0 nud permanent\n",
                addr::FH
            ),
        )?;
        sysctl(&gw, &[("net.ipv4.ip_forward", "1")])?;
        for k in 1..=n {
            let msr = self.ns(Host::Msr(k));
            run_ip(
                Some(&msr),
                &format!(
                    "addr add {}/24 dev cell0\nlink set cell0 up\nroute add default via {}\n",
                    addr::CELL_GW,
                    addr::GW_LAN
                ),
            )?;
            sysctl(&msr, &[("net.ipv4.ip_forward", "1")])?;
        }
        for j in 1..=self.mhs {
            run_ip(
                Some(&self.ns(Host::mh(j))),
                &format!(
                    "addr add {}/24 dev air0\nlink set air0 up\nroute add default via {}\n",
                    addr::mh(j),
                    addr::CELL_GW
                ),
            )?;
        }
        if self.config.ipv6 {
            self.build_ipv6()?;
        }
        let first = self.config.initial_cells.first().copied().unwrap_or(1);
        for j in 1..=self.mhs {
            reroute_mh(
                &self.ns(Host::Gw),
                &self.ns(Host::mh(j)),
                addr::mh(j),
                first,
            )?;
        }
        Ok(())
    }

    /// IPv6 addresses and routes on the links `build` made (see [`addr6`]).
    fn build_ipv6(&self) -> io::Result<()> {
        let (gw, n) = (self.ns(Host::Gw), self.config.msrs);
        run_ip(
            Some(&self.ns(Host::Fh)),
            &format!(
                "addr add {}/64 dev wan0 nodad\nroute add default via {}\nneigh replace {} lladdr {WAN_GW_MAC} dev wan0 nud permanent\n",
                addr6::FH,
                addr6::GW_WAN,
                addr6::GW_WAN
            ),
        )?;
        run_ip(
            Some(&gw),
            &format!(
                "addr add {}/64 dev wan0 nodad\naddr add {}/64 dev br0 nodad\nneigh replace {} lladdr {WAN_FH_MAC} dev wan0 nud permanent\n",
                addr6::GW_WAN,
                addr6::GW_LAN,
                addr6::FH
            ),
        )?;
        sysctl(&gw, &[("net.ipv6.conf.all.forwarding", "1")])?;
        for k in 1..=n {
            let msr = self.ns(Host::Msr(k));
            run_ip(
                Some(&msr),
                &format!(
                    "addr add {}/64 dev lan0 nodad\naddr add {}/64 dev cell0 nodad\nroute add default via {}\n",
                    addr6::msr_lan(k),
                    addr6::CELL_GW,
                    addr6::GW_LAN
                ),
            )?;
            sysctl(&msr, &[("net.ipv6.conf.all.forwarding", "1")])?;
        }
        for j in 1..=self.mhs {
            run_ip(
                Some(&self.ns(Host::mh(j))),
                &format!(
                    "addr add {}/64 dev air0 nodad\nroute add default via {}\n",
                    addr6::mh(j),
                    addr6::CELL_GW
                ),
            )?;
        }
        Ok(())
    }

    fn start_airlink(&mut self) -> io::Result<()> {
        let c = &self.config;
        let n = c.msrs;
        let port = |h: Host, ifname: &str, mac: Option<String>| PortSpec {
            name: format!("{}.{ifname}", h.suffix()),
            netns: self.ns(h),
            ifname: ifname.into(),
            mac,
        };
        let mut ports = vec![
            port(Host::Fh, "wan0", Some(WAN_FH_MAC.into())),
            port(Host::Gw, "wan0", Some(WAN_GW_MAC.into())),
            port(Host::Mh, "air0", Some(addr::MH_MAC.into())),
        ];
        ports.extend((2..=self.mhs).map(|j| port(Host::mh(j), "air0", Some(addr::mh_mac(j)))));
        ports.extend((1..=n).map(|k| port(Host::Msr(k), "cell0", Some(addr::msr_cell_mac(k)))));
        let topo = Topology {
            seed: c.seed,
            ports,
            wires: vec![WireSpec {
                name: "wan".into(),
                down_from: "fh.wan0".into(),
                down_to: "gw.wan0".into(),
                down: c.wan_down.clone(),
                up: c.wan_up.clone(),
            }],
            air: Some(AirSpec {
                mh: "mh.air0".into(),
                mhs: (2..=self.mhs).map(|j| format!("mh{j}.air0")).collect(),
                cells: (1..=n)
                    .map(|k| CellSpec {
                        port: format!("msr{k}.cell0"),
                        down: c.cell_down.clone(),
                        up: c.cell_up.clone(),
                    })
                    .collect(),
                initial: c.initial_cells.clone(),
            }),
        };
        let cfg = self.dir.join("airlink.json");
        std::fs::write(&cfg, serde_json::to_vec_pretty(&topo).unwrap())?;
        let log = File::create(self.dir.join("airlink.log"))?;
        let priority = if AIRLINK_FIFO.load(Ordering::Relaxed) {
            "fifo"
        } else {
            "normal"
        };
        let mut child = Command::new(bin_path("airlink"))
            .arg("--config")
            .arg(&cfg)
            .arg("--control")
            .arg(&self.control)
            .args(["--priority", priority])
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot start {}: {e}", bin_path("airlink").display()),
                )
            })?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line)?;
        self.airlink = Some(child);
        if line.trim() != "ready" {
            let err = std::fs::read_to_string(self.dir.join("airlink.log")).unwrap_or_default();
            return Err(io::Error::other(format!(
                "airlink did not start: {}",
                err.trim()
            )));
        }
        Ok(())
    }

    /// Points the fixed network (GW) and the MH at MSR `k`: the GW's host route for the
    /// MH and the MH's neighbour entry for the shared gateway address. This is what a
    /// Mobile-IP registration achieves; the I-TCP daemon does its own routing later.
    pub fn route_mh_via(&self, k: usize) -> io::Result<()> {
        reroute(&self.ns(Host::Gw), &self.ns(Host::Mh), k)
    }

    /// Another station on the MH's cell of a veth lab: namespace `<lab>-<name>` (removed
    /// with the lab) holding a macvlan of the MH's `air0` as `air0`, with a MAC of its
    /// own (`mac`), address `ip`/24 and a default route through the cell gateway; the
    /// GW routes `ip` through MSR1. Returns the namespace.
    pub fn add_station(
        &mut self,
        name: &str,
        ip: std::net::Ipv4Addr,
        mac: &str,
    ) -> io::Result<String> {
        if !self.config.veth {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "stations are macvlans of the MH's veth: veth labs only",
            ));
        }
        let ns = format!("{}-{name}", self.id);
        // Registered first, so the namespace goes with the lab whatever fails next.
        if let Some(o) = LIVE.lock().unwrap().iter_mut().find(|o| o.id == self.id) {
            o.namespaces.push(ns.clone());
        }
        run_ip(None, &format!("netns add {ns}\n"))?;
        run_ip(
            Some(&self.ns(Host::Mh)),
            &format!("link add st0 link air0 address {mac} type macvlan mode bridge\nlink set st0 netns {ns}\n"),
        )?;
        run_ip(
            Some(&ns),
            &format!(
                "link set lo up\nlink set st0 name air0\naddr add {ip}/24 dev air0\nlink set air0 up\nroute add default via {}\n",
                addr::CELL_GW
            ),
        )?;
        run_ip(
            Some(&self.ns(Host::Gw)),
            &format!("route replace {ip}/32 via {}\n", addr::msr_lan(1)),
        )?;
        Ok(ns)
    }

    /// Sends one request line to the emulator as it is and returns its reply, an error
    /// reply included (for tests of malformed requests).
    pub fn emu_line(&self, line: &str) -> io::Result<Reply> {
        if self.config.veth {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this lab has veth links and no emulator",
            ));
        }
        emu_line_at(&self.control, line)
    }

    /// Sends one request to the emulator and returns its reply (errors as Err).
    pub fn emu(&self, req: Request) -> io::Result<ReplyBody> {
        let line = serde_json::to_string(&req).expect("requests serialize");
        self.emu_line(&line)?
            .into_result()
            .map_err(|e| io::Error::other(format!("airlink refused {line}: {e}")))
    }

    /// Puts the MH in exactly these cells.
    pub fn assoc(&self, cells: &[usize]) -> io::Result<()> {
        self.emu(Request::Assoc {
            cells: cells.to_vec(),
            mh: None,
        })
        .map(|_| ())
    }

    /// Puts MH `j` (1-based) in exactly these cells.
    pub fn assoc_mh(&self, j: usize, cells: &[usize]) -> io::Result<()> {
        self.emu(Request::Assoc {
            cells: cells.to_vec(),
            mh: Some(j),
        })
        .map(|_| ())
    }

    /// Drops everything the emulator has queued in cell `k` (every MH, both ways).
    pub fn flush_cell(&self, k: usize) -> io::Result<()> {
        self.emu(Request::Flush { cell: k }).map(|_| ())
    }

    /// Every link's counters.
    pub fn counters(&self) -> io::Result<CountersReply> {
        counters_at(&self.control)
    }

    /// One line on the emulator's late deliveries per link direction (a busy machine
    /// slows the emulated links): read it beside a test's timing or RST failure.
    pub fn late_frames(&self) -> String {
        let Ok(c) = self.counters() else {
            return "--- emulator: counters unavailable\n".into();
        };
        let mut s = String::from("--- emulator late deliveries (count, max µs):");
        for (name, l) in &c.links {
            s += &format!(
                " {name} down ({}, {}) up ({}, {});",
                l.down.late, l.down.max_late_us, l.up.late, l.up.max_late_us
            );
        }
        s + "\n"
    }

    /// Association, its history, the schedule and the links.
    pub fn emu_status(&self) -> io::Result<StatusReply> {
        match self.emu(Request::Status)? {
            ReplyBody::Status(s) => Ok(s),
            other => Err(io::Error::other(format!("airlink answered {other:?}"))),
        }
    }

    /// Pids of the processes the lab started (airlink first).
    pub fn pids(&self) -> Vec<u32> {
        self.airlink
            .iter()
            .chain(self.children.iter())
            .map(Child::id)
            .collect()
    }

    /// Sets sysctls (dotted names, e.g. `net.ipv4.tcp_tw_reuse`) in host `h`'s namespace.
    pub fn sysctl(&self, h: Host, settings: &[(&str, &str)]) -> io::Result<()> {
        sysctl(&self.ns(h), settings)
    }

    /// Pid of a spawned process (by index).
    pub fn pid(&self, idx: usize) -> u32 {
        self.children[idx].id()
    }

    /// Path of the emulator's control socket, for tools outside this process.
    pub fn control_path(&self) -> &Path {
        &self.control
    }

    /// MH `j`'s session token file (1-based; MH 1's is `<lab dir>/mh-token`).
    pub fn mh_token_file(&self, j: usize) -> PathBuf {
        if j <= 1 {
            self.dir.join("mh-token")
        } else {
            self.dir.join(format!("mh{j}-token"))
        }
    }

    /// A command that runs `program` inside host `h`'s namespace and dies with us.
    pub fn command(&self, h: Host, program: impl AsRef<std::ffi::OsStr>) -> io::Result<Command> {
        let ns = File::open(format!("/run/netns/{}", self.ns(h)))?;
        let mut cmd = Command::new(program);
        // One token per MH: its apps and its mobility agent share it, MHs and labs do
        // not.
        cmd.env(
            "ITCP_TOKEN_FILE",
            self.mh_token_file(h.mh_index().unwrap_or(1)),
        );
        // SAFETY: between fork and exec we only call setns and prctl, which are
        // async-signal-safe; `ns` stays open because the closure owns it.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                );
                Ok(())
            });
        }
        Ok(cmd)
    }

    /// Starts a process in host `h` that the lab kills on teardown. Its stdout is piped.
    pub fn spawn(
        &mut self,
        h: Host,
        program: impl AsRef<std::ffi::OsStr>,
        args: &[&str],
    ) -> io::Result<usize> {
        self.spawn_env(h, program, args, &[])
    }

    /// [`Lab::spawn`] with extra environment variables.
    pub fn spawn_env(
        &mut self,
        h: Host,
        program: impl AsRef<std::ffi::OsStr>,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> io::Result<usize> {
        let child = self
            .command(h, program)?
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        self.children.push(child);
        Ok(self.children.len() - 1)
    }

    /// Starts a long-running process in host `h` with stdout and stderr going to
    /// `<lab dir>/<log>` (daemons: a pipe nobody reads would block them).
    pub fn spawn_logged(
        &mut self,
        h: Host,
        program: impl AsRef<std::ffi::OsStr>,
        args: &[&str],
        log: &str,
    ) -> io::Result<usize> {
        let f = File::create(self.dir.join(log))?;
        let child = self
            .command(h, program)?
            .args(args)
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()?;
        self.children.push(child);
        Ok(self.children.len() - 1)
    }

    /// Starts msrd on MSR `k` with the given config text (written to
    /// `<lab dir>/msr<k>.toml`) and waits until its control socket answers.
    /// The config's control socket must be [`Lab::msrd_control`]`(k)`.
    pub fn start_msrd(&mut self, k: usize, config: &str) -> io::Result<usize> {
        std::fs::write(self.dir.join(format!("msr{k}.toml")), config)?;
        File::create(self.dir.join(format!("msrd{k}.log")))?;
        let mut child = self.launch_msrd(k)?;
        let r = self.wait_msrd_up(k, &mut child);
        self.children.push(child);
        r.map(|()| self.children.len() - 1)
    }

    /// Drops the extra environment of MSR `k` (e.g. a fault hook): the next
    /// [`Lab::restart_msrd`] starts it plain.
    pub fn clear_msrd_env(&mut self, k: usize) {
        self.msrd_env.retain(|(j, ..)| *j != k);
    }

    /// Starts msrd on MSR `k` again with the config [`Lab::start_msrd`] wrote (after a
    /// crash, say), its output appended to the same log, and waits until its control
    /// socket answers. The caller owns the process: kill and wait for it (it also dies
    /// with the lab's namespaces and with this process).
    pub fn restart_msrd(&self, k: usize) -> io::Result<Child> {
        self.wait_msrd_gone(k);
        let mut child = self.launch_msrd(k)?;
        if let Err(e) = self.wait_msrd_up(k, &mut child) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        Ok(child)
    }

    /// Waits (at most 5 s) until no msrd runs in MSR `k`'s namespace: one still
    /// exiting holds its listening sockets, and a new one would fail to bind them
    /// ("Address already in use"). An exiting process leaves the namespace before its
    /// last sockets close (the kernel releases its files after its namespaces), so
    /// those this lab started are waited for until they have exited whole.
    fn wait_msrd_gone(&self, k: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let running = || {
            netns_pids(&self.ns(Host::Msr(k))).iter().any(|pid| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"));
                comm.is_ok_and(|c| c.trim() == "msrd")
            })
        };
        while running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let ours: Vec<i32> = self
            .msrd_pids
            .lock()
            .unwrap()
            .iter()
            .filter(|(j, _)| *j == k)
            .map(|&(_, pid)| pid)
            .collect();
        for pid in ours {
            while !exited(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn launch_msrd(&self, k: usize) -> io::Result<Child> {
        let cfg = self.dir.join(format!("msr{k}.toml")).display().to_string();
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("msrd{k}.log")))?;
        let bin = self.msrd_bin.clone().unwrap_or_else(|| bin_path("msrd"));
        let mut cmd = self.command(Host::Msr(k), bin)?;
        for (_, n, v) in self.msrd_env.iter().filter(|(j, ..)| *j == k) {
            cmd.env(n, v);
        }
        if let Some(cpu) = msrd_cpu(k) {
            // SAFETY: sched_setaffinity on the child itself, between fork and exec;
            // every thread msrd starts inherits it.
            unsafe {
                cmd.pre_exec(move || {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if let Some(u) = self.msrd_user.clone() {
            u.own(&self.dir)?;
            // SAFETY: become_it makes only async-signal-safe calls.
            unsafe { cmd.pre_exec(move || u.become_it()) };
        }
        let child = cmd
            .args(["--config", &cfg])
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()?;
        self.msrd_pids.lock().unwrap().push((k, child.id() as i32));
        Ok(child)
    }

    fn wait_msrd_up(&self, k: usize, child: &mut Child) -> io::Result<()> {
        let sock = self.msrd_control(k);
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&sock).is_err() {
            if let Some(st) = child.try_wait()? {
                let log = std::fs::read_to_string(self.dir.join(format!("msrd{k}.log")))
                    .unwrap_or_default();
                return Err(io::Error::other(format!(
                    "msrd on MSR{k} exited ({st}):\n{log}"
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "msrd on MSR{k} did not come up in 10 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The lab's CA and MSR certificates (`scripts/msr-certs`, the operators' recipe),
    /// made once per lab: the directory holding `ca.pem`, `msrK.pem`, `msrK.key`.
    pub fn channel_certs(&self) -> io::Result<PathBuf> {
        let dir = self.dir.join("certs");
        if dir.join("ca.pem").exists() {
            return Ok(dir);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/msr-certs");
        let ids: Vec<String> = (1..=self.config.msrs).map(|k| format!("msr{k}")).collect();
        let out = Command::new(&script).arg(&dir).args(&ids).output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "{}: {}",
                script.display(),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(dir)
    }

    /// The `[handoff]` section of MSR `k` in a lab with I-TCP mobility: the MSR⇄MSR
    /// channel on its LAN address (mutual TLS with the lab CA's certificates, or one
    /// key per pair: [`Lab::channel_tls`]), proxy ARP on `lan0`, every other MSR a
    /// peer, the handoff log in the lab directory.
    pub fn handoff_config(&self, k: usize) -> String {
        let mut s = format!(
            "[handoff]\nlisten = \"{}:4347\"\nlan_interface = \"lan0\"\nlog_file = \"{}\"\n{}\n",
            addr::msr_lan(k),
            self.handoff_log(k).display(),
            self.handoff_extra
        );
        for j in (1..=self.config.msrs).filter(|&j| j != k) {
            let pair = k.min(j) * 100 + k.max(j);
            s += &format!(
                "\n[[handoff.peer]]\nid = \"msr{j}\"\naddress = \"{}:4347\"\n",
                addr::msr_lan(j)
            );
            if !self.channel_tls {
                s += &format!("key = \"{pair:032x}\"\n");
            }
        }
        if self.channel_tls {
            let d = self.channel_certs().expect("lab CA and MSR certificates");
            s += &format!(
                "\n[handoff.tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
                d.join("ca.pem").display(),
                d.join(format!("msr{k}.pem")).display(),
                d.join(format!("msr{k}.key")).display()
            );
        }
        s
    }

    /// Counts TCP RSTs sent and received by host `h` (an nftables table of its own in
    /// its namespace); read with [`Lab::rsts`].
    pub fn watch_rsts(&self, h: Host) -> io::Result<()> {
        let script = "table inet rstwatch {\n  counter rst_in { }\n  counter rst_out { }\n  chain i { type filter hook input priority -300; tcp flags & rst == rst counter name \"rst_in\"; }\n  chain o { type filter hook output priority -300; tcp flags & rst == rst counter name \"rst_out\"; }\n}\n";
        self.nft(h, script)
    }

    /// Sends, from host `h`'s namespace, a bare TCP ACK on the flow `src` → `dst`
    /// (sequence numbers no socket expects): a late stray segment of a flow, to see
    /// who answers it.
    pub fn send_stray_ack(
        &self,
        h: Host,
        src: std::net::SocketAddr,
        dst: std::net::SocketAddr,
    ) -> io::Result<()> {
        crate::sys::in_netns(&self.ns(h), move || {
            let here =
                std::net::UdpSocket::bind(if dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
            let seg = itcp_handoff::packet::Segment {
                src,
                dst,
                seq: 1_000_000,
                ack: 2_000_000,
                window: 500,
                fin: false,
                timestamps: None,
            };
            itcp_handoff::repair::send_raw_ip_to(
                std::os::fd::AsFd::as_fd(&here),
                &dst,
                &seg.to_ip_packet(),
                0,
            )
        })
    }

    /// Runs an nftables script in host `h`'s namespace.
    pub fn nft(&self, h: Host, script: &str) -> io::Result<()> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns(h), "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child.stdin.take().unwrap().write_all(script.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "nft in {}: {}",
                self.ns(h),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }

    /// (RSTs received, RSTs sent) by host `h` since [`Lab::watch_rsts`].
    pub fn rsts(&self, h: Host) -> io::Result<(u64, u64)> {
        let get = |name: &str| -> io::Result<u64> {
            let out = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &self.ns(h),
                    "nft",
                    "list",
                    "counter",
                    "inet",
                    "rstwatch",
                    name,
                ])
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            text.split_whitespace()
                .skip_while(|w| *w != "packets")
                .nth(1)
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| io::Error::other(format!("no counter {name} in {text:?}")))
        };
        Ok((get("rst_in")?, get("rst_out")?))
    }

    /// Starts tcpdump in host `h` with `args`, its standard output to `stdout` and its
    /// messages to `log`, and waits until it captures ("listening on"): an error if it
    /// exits first or takes over 10 s.
    pub fn start_tcpdump(
        &self,
        h: Host,
        args: &[&str],
        stdout: Stdio,
        log: &Path,
    ) -> io::Result<Child> {
        let mut child = self
            .command(h, "tcpdump")?
            .args(args)
            .stdout(stdout)
            .stderr(File::create(log)?)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot start tcpdump: {e}")))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if text.contains("listening on") {
                return Ok(child);
            }
            let exited = child.try_wait()?;
            if exited.is_some() || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let why = exited.map_or("did not start in 10 s".to_string(), |st| {
                    format!("exited ({st})")
                });
                return Err(io::Error::other(format!("tcpdump {why}: {text}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Records host `h`'s TCP, ARP and ICMP headers (all interfaces, link-layer headers
    /// too) in `<lab dir>/<host>.pcap` until the lab ends: for reading a slow or failed
    /// run afterwards (with ITCP_LAB_KEEP=1).
    pub fn record_packets(&mut self, h: Host) -> io::Result<()> {
        let f = self.dir.join(format!("{}.pcap", h.suffix()));
        let log = self.dir.join(format!("{}-pcap.log", h.suffix()));
        let f = f.display().to_string();
        let args = [
            "-i",
            "any",
            "-U",
            "-nn",
            "-s",
            "128",
            "-w",
            &f,
            "tcp or arp or icmp or icmp6",
        ];
        let child = self.start_tcpdump(h, &args, Stdio::null(), &log)?;
        self.children.push(child);
        Ok(())
    }

    /// Captures host `h`'s TCP headers as text (`<lab dir>/tcp-<host>.txt`, one line per
    /// segment with its time and direction), for [`crate::moves::ack_waits`].
    pub fn watch_tcp(&mut self, h: Host) -> io::Result<PathBuf> {
        let out = self.dir.join(format!("tcp-{}.txt", h.suffix()));
        let log = self.dir.join(format!("tcp-{}.log", h.suffix()));
        let args = [
            "-i",
            "any",
            "-nn",
            "-tt",
            "-l",
            "--immediate-mode",
            "-s",
            "96",
            "tcp",
        ];
        let child = self.start_tcpdump(h, &args, File::create(&out)?.into(), &log)?;
        self.children.push(child);
        Ok(out)
    }

    /// Captures the FINs and RSTs host `h` sends and receives (tcpdump, text in
    /// `<lab dir>/closes-<host>.txt`), for [`Lab::rsts_after_clean_close`].
    pub fn watch_closes(&mut self, h: Host) -> io::Result<()> {
        let out = self.dir.join(format!("closes-{}.txt", h.suffix()));
        let log = self.dir.join(format!("closes-{}.log", h.suffix()));
        let filter = "tcp[tcpflags] & (tcp-rst | tcp-fin) != 0 or (ip6 and ip6[6] == 6 and ip6[53] & 5 != 0)";
        let args = ["-i", "any", "-nn", "-tt", "-S", "-l", "--immediate-mode"];
        let args: Vec<&str> = args.into_iter().chain(["-s", "128", filter]).collect();
        let child = self.start_tcpdump(h, &args, File::create(&out)?.into(), &log)?;
        self.children.push(child);
        Ok(())
    }

    /// How many RSTs host `h` sent after its own clean close (see [`crate::closes`]),
    /// from the capture [`Lab::watch_closes`] started; 0 without one.
    pub fn rsts_after_clean_close(&self, h: Host) -> io::Result<u64> {
        let path = self.dir.join(format!("closes-{}.txt", h.suffix()));
        if !path.exists() {
            return Ok(0);
        }
        // tcpdump writes each line as it sees the packet; give the last one time.
        std::thread::sleep(Duration::from_millis(200));
        let text = std::fs::read_to_string(path)?;
        let segs: Vec<_> = text.lines().filter_map(crate::closes::parse_line).collect();
        Ok(crate::closes::rsts_after_clean_close(&segs) as u64)
    }

    /// Starts `itcp-lab echo` at the FH on `port` (log `echo.log`) and waits until it
    /// listens.
    pub fn start_fh_echo(&mut self, port: u16) -> io::Result<()> {
        let listen = fh_addr(port);
        self.spawn_logged(
            Host::Fh,
            bin_path("itcp-lab"),
            &["echo", "--listen", &listen],
            "echo.log",
        )?;
        self.wait_listening(Host::Fh, port)
    }

    /// Waits until something listens on TCP `port` in host `h` (checked with `ss`,
    /// without connecting to it).
    pub fn wait_listening(&self, h: Host, port: u16) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let out = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &self.ns(h),
                    "ss",
                    "-Hltn",
                    &format!("sport = :{port}"),
                ])
                .output()?;
            if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "nothing listens on port {port} in {h:?} after 5 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// MSR `k`'s handoff log.
    pub fn handoff_log(&self, k: usize) -> PathBuf {
        self.dir.join(format!("handoffs-msr{k}.jsonl"))
    }

    /// Sets up I-TCP mobility: the GW routes the MH prefix on-link (the MSR serving an MH
    /// answers ARP for it), msrd with `[handoff]` runs on every MSR (`msrd_extra`
    /// appended to each config, `{MSR_LAN}` in it replaced by that MSR's LAN address),
    /// and every MH's mobility agent runs with `agent_args` (e.g. `--policy lazy`).
    /// Waits until every agent has attached to an MSR. Returns the spawn indices of the
    /// msrds (MSR order) and of MH 1's agent.
    pub fn start_itcp_mobility(
        &mut self,
        msrd_extra: &str,
        agent_args: &[&str],
    ) -> io::Result<(Vec<usize>, usize)> {
        self.start_itcp_mobility_env(msrd_extra, agent_args, &[])
    }

    /// [`Lab::start_itcp_mobility`] with extra environment per MSR: `(k, NAME, VALUE)`.
    pub fn start_itcp_mobility_env(
        &mut self,
        msrd_extra: &str,
        agent_args: &[&str],
        env: &[(usize, &str, &str)],
    ) -> io::Result<(Vec<usize>, usize)> {
        self.msrd_env = env
            .iter()
            .map(|(k, n, v)| (*k, n.to_string(), v.to_string()))
            .collect();
        let msrds = self.start_msrds_with_handoff(msrd_extra)?;
        let agent = self.start_agents(1..=self.mhs, agent_args)?;
        Ok((msrds, agent))
    }

    /// Starts the mobility agent on MHs `mhs` (with `agent_args`) and waits until each
    /// has attached to an MSR. Returns the spawn index of the first one's agent.
    fn start_agents(
        &mut self,
        mhs: std::ops::RangeInclusive<usize>,
        agent_args: &[&str],
    ) -> io::Result<usize> {
        let mut agents = Vec::new();
        for j in mhs.clone() {
            let events = File::create(self.agent_events_path(j))?;
            let log = File::create(self.agent_log_path(j))?;
            let mh = addr::mh(j).to_string();
            let mh6 = addr6::mh(j).to_string();
            let gw = addr::CELL_GW.to_string();
            let gw6 = addr6::CELL_GW.to_string();
            let mut args = vec!["--interface", "air0", "--mh", &mh, "--gateway", &gw];
            // A dual-stack MH's agent greets for both its addresses and points both
            // gateway addresses.
            if self.config.ipv6 {
                args.extend(["--mh", mh6.as_str(), "--gateway", gw6.as_str()]);
            }
            args.extend_from_slice(agent_args);
            let child = self
                .command(Host::mh(j), bin_path("itcp-mh-agent"))?
                .args(&args)
                .stdout(events)
                .stderr(log)
                .spawn()
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot start itcp-mh-agent: {e}"))
                })?;
            self.children.push(child);
            agents.push(self.children.len() - 1);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for j in mhs {
            while !self
                .agent_events_of(j)
                .iter()
                .any(|e| e["event"] == "attached")
            {
                if Instant::now() > deadline {
                    let log = std::fs::read_to_string(self.agent_log_path(j)).unwrap_or_default();
                    return Err(io::Error::other(format!(
                        "the agent of MH {j} did not attach in 10 s: events {:?}, log {log}",
                        self.agent_events_of(j)
                    )));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(agents[0])
    }

    /// Sets up I-TCP for MHs that run nothing of ours: msrd with `[handoff]` on every
    /// MSR, the shared gateway MAC [`addr::GATEWAY_MAC`] on every cell, network
    /// detection on every cell (`msrd_extra` appended to each config as in
    /// [`Lab::start_itcp_mobility`]), no agent. The MHs forget the per-MSR neighbour
    /// entries the lab gave them and resolve the gateway by ARP, as any host does.
    /// Returns the spawn indices of the msrds (MSR order).
    pub fn start_itcp_network(&mut self, msrd_extra: &str) -> io::Result<Vec<usize>> {
        self.msr_extra = format!("gateway_mac = \"{}\"\n", addr::GATEWAY_MAC);
        self.cell_extra = format!("detect = \"network\"\n{}", self.cell_extra);
        let msrds = self.start_msrds_with_handoff(msrd_extra)?;
        self.forget_gateway_neighbours(1..=self.mhs)?;
        Ok(msrds)
    }

    /// [`Lab::start_itcp_network`], with the mobility agent running on MH 1 only
    /// (started as in [`Lab::start_itcp_mobility`]): the other MHs run nothing of
    /// ours and are served by network detection. Returns the spawn indices of the
    /// msrds (MSR order) and of MH 1's agent.
    pub fn start_itcp_agent_and_bare(
        &mut self,
        msrd_extra: &str,
        agent_args: &[&str],
    ) -> io::Result<(Vec<usize>, usize)> {
        let msrds = self.start_itcp_network(msrd_extra)?;
        let agent = self.start_agents(1..=1, agent_args)?;
        Ok((msrds, agent))
    }

    /// MHs `mhs` forget the per-MSR neighbour entries the lab gave them and resolve
    /// the gateway by ARP and NDP, as any host does.
    fn forget_gateway_neighbours(&self, mhs: std::ops::RangeInclusive<usize>) -> io::Result<()> {
        for j in mhs {
            let mut b = format!("neigh del {} dev air0\n", addr::CELL_GW);
            if self.config.ipv6 {
                b += &format!("neigh del {} dev air0\n", addr6::CELL_GW);
            }
            run_ip(Some(&self.ns(Host::mh(j))), &b)?;
        }
        Ok(())
    }

    /// Routes the MH prefixes on-link at the GW (the MSR serving an MH answers ARP/NDP
    /// for it) and starts msrd with `[handoff]` on every MSR, `msrd_extra` appended to
    /// each config (`{MSR_LAN}` in it replaced by that MSR's LAN address). Returns the
    /// spawn indices of the msrds (MSR order).
    fn start_msrds_with_handoff(&mut self, msrd_extra: &str) -> io::Result<Vec<usize>> {
        let mut gw = String::new();
        for j in 1..=self.mhs {
            gw += &format!("route del {}/32\n", addr::mh(j));
        }
        gw += "route replace 10.2.0.0/24 dev br0\n";
        gw += &self.onlink6();
        run_ip(Some(&self.ns(Host::Gw)), &gw)?;
        let mut msrds = Vec::new();
        for k in 1..=self.config.msrs {
            // "{MSR_LAN}" in msrd_extra is MSR k's fixed-LAN address.
            let mine = msrd_extra.replace("{MSR_LAN}", &addr::msr_lan(k).to_string());
            let extra = format!("{}\n{mine}", self.handoff_config(k));
            let cfg = self.msrd_config(k, &extra);
            msrds.push(self.start_msrd(k, &cfg)?);
        }
        Ok(msrds)
    }

    /// `ip -batch` lines routing the IPv6 cells' prefix on-link at the GW (the MSR
    /// serving an MH answers NDP for it), replacing the per-MH host routes.
    fn onlink6(&self) -> String {
        if !self.config.ipv6 {
            return String::new();
        }
        let mut s = String::new();
        for j in 1..=self.mhs {
            s += &format!("route del {}/128\n", addr6::mh(j));
        }
        s + &format!("route replace {} dev br0\n", addr6::CELLS)
    }

    /// Where MH `j`'s agent writes its events (`agent.events` for MH 1,
    /// `agent<j>.events` for the others).
    pub fn agent_events_path(&self, j: usize) -> PathBuf {
        if j <= 1 {
            self.dir.join("agent.events")
        } else {
            self.dir.join(format!("agent{j}.events"))
        }
    }

    fn agent_log_path(&self, j: usize) -> PathBuf {
        if j <= 1 {
            self.dir.join("agent.log")
        } else {
            self.dir.join(format!("agent{j}.log"))
        }
    }

    /// The MH agent's events so far (JSON objects).
    pub fn agent_events(&self) -> Vec<Value> {
        self.agent_events_of(1)
    }

    /// MH `j`'s agent's events so far (JSON objects).
    pub fn agent_events_of(&self, j: usize) -> Vec<Value> {
        std::fs::read_to_string(self.agent_events_path(j))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// MSR `k`'s MAC on its cell interface, as the kernel has it now.
    pub fn msr_cell_mac_now(&self, k: usize) -> io::Result<String> {
        let o = self.run(Host::Msr(k), "ip", &["-br", "link", "show", "cell0"])?;
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        Ok(out
            .split_whitespace()
            .nth(2)
            .unwrap_or_default()
            .to_string())
    }

    /// Handoff records MSR `k` wrote so far.
    pub fn handoff_records(&self, k: usize) -> Vec<itcp_handoff::log::Record> {
        itcp_handoff::log::read(&self.handoff_log(k), &Default::default())
            .map(|(r, _)| r)
            .unwrap_or_default()
    }

    /// Sends `sig` to a spawned process (by index).
    pub fn signal(&self, idx: usize, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.children[idx].id() as i32, sig) };
    }

    /// Control socket path of MSR `k`'s msrd.
    pub fn msrd_control(&self, k: usize) -> PathBuf {
        self.dir.join(format!("msrd{k}.sock"))
    }

    /// A minimal msrd config for MSR `k` of this lab; `extra` is appended verbatim
    /// (more sections, e.g. `[wireless]`).
    pub fn msrd_config(&self, k: usize, extra: &str) -> String {
        let beacon = if self.beacon_offsets && !extra.contains("[beacon]") {
            format!(
                "\n[beacon]\noffset_ms = {}\n",
                beacon_offset_ms(self.config.seed, k)
            )
        } else {
            String::new()
        };
        let (gw6, cells6) = if self.config.ipv6 {
            (
                format!(", \"{}\"", addr6::CELL_GW),
                format!(", \"{}\"", addr6::CELLS),
            )
        } else {
            (String::new(), String::new())
        };
        format!(
            "[msr]\nid = \"msr{k}\"\ngateway = [\"{}\"{gw6}]\ncontrol_socket = \"{}\"\nlog_level = \"{}\"\n{}\n[access]\nmh_prefixes = [\"10.2.0.0/24\"{cells6}]\n{}\n\n[[cell]]\ninterface = \"cell0\"\n{}\n{extra}{beacon}",
            addr::CELL_GW,
            self.msrd_control(k).display(),
            self.msrd_log_level,
            self.msr_extra,
            self.access_extra,
            self.cell_extra.replace("{MSR}", &k.to_string())
        )
    }

    /// Sends one request line to MSR `k`'s msrd control socket as it is, and returns
    /// the reply line.
    pub fn msrd_line(&self, k: usize, line: &str) -> io::Result<String> {
        let mut s = UnixStream::connect(self.msrd_control(k))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(format!("{}\n", line.trim()).as_bytes())?;
        let mut reply = String::new();
        BufReader::new(&s).read_line(&mut reply)?;
        Ok(reply)
    }

    /// Sends one request to MSR `k`'s msrd control socket.
    pub fn msrd(&self, k: usize, req: control::Request) -> io::Result<control::Reply> {
        let reply = self.msrd_line(k, req.to_line().trim())?;
        control::Reply::parse(&reply).map_err(io::Error::other)
    }

    /// MSR `k`'s counters.
    pub fn msrd_stats(&self, k: usize) -> io::Result<control::StatsReply> {
        self.msrd(k, control::Request::Stats)?
            .stats()
            .map_err(io::Error::other)
    }

    /// MSR `k`'s live connections.
    pub fn msrd_sessions(&self, k: usize) -> io::Result<Vec<control::SessionInfo>> {
        Ok(self
            .msrd(k, control::Request::Sessions)?
            .sessions()
            .map_err(io::Error::other)?
            .sessions)
    }

    /// Sends SIGTERM to a spawned process (by index).
    pub fn terminate(&self, idx: usize) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.children[idx].id() as i32, libc::SIGTERM) };
    }

    /// Waits for a spawned process (by index) with a deadline; kills it on timeout.
    /// Returns (exit success, stdout, stderr).
    pub fn wait(&mut self, idx: usize, timeout: Duration) -> io::Result<(bool, String, String)> {
        let deadline = Instant::now() + timeout;
        let child = &mut self.children[idx];
        // Read pipes on threads so a chatty child cannot block on a full pipe.
        let out = child.stdout.take().map(read_all_thread);
        let err = child.stderr.take().map(read_all_thread);
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break Some(s);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = out
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        let mut err = err
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        if status.is_none() {
            err += &format!("\n(killed after {timeout:?} timeout)");
        }
        Ok((status.is_some_and(|s| s.success()), out, err))
    }

    /// Runs a command in host `h` to completion.
    pub fn run(&self, h: Host, program: &str, args: &[&str]) -> io::Result<std::process::Output> {
        self.command(h, program)?.args(args).output()
    }
}

fn read_all_thread<R: io::Read + Send + 'static>(mut r: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(a) = &mut self.airlink {
            let _ = a.kill();
            let _ = a.wait();
        }
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pos) = live.iter().position(|o| o.id == self.id) {
            let o = live.remove(pos);
            drop(live);
            remove(&o);
        }
    }
}

/// Default MSR count etc. are fine for most tests; this is the MH's address as a
/// string for command lines.
pub fn mh_addr(port: u16) -> String {
    format!("{}:{port}", addr::MH)
}

/// Same for the FH.
pub fn fh_addr(port: u16) -> String {
    format!("{}:{port}", addr::FH)
}

/// Sends one request line to the emulator listening on `control` and returns its reply.
pub fn emu_line_at(control: &Path, line: &str) -> io::Result<Reply> {
    let mut s = UnixStream::connect(control)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("{}\n", line.trim()).as_bytes())?;
    let mut reply = String::new();
    BufReader::new(&s).read_line(&mut reply)?;
    serde_json::from_str(&reply)
        .map_err(|e| io::Error::other(format!("airlink reply {reply:?}: {e}")))
}

/// The counters of the emulator listening on `control` (from any thread).
pub fn counters_at(control: &Path) -> io::Result<CountersReply> {
    let line = serde_json::to_string(&Request::Counters).expect("requests serialize");
    match emu_line_at(control, &line)?.into_result() {
        Ok(ReplyBody::Counters(c)) => Ok(c),
        Ok(other) => Err(io::Error::other(format!("airlink answered {other:?}"))),
        Err(e) => Err(io::Error::other(format!(
            "airlink refused the counters: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::cpu_mask;

    #[test]
    fn cpu_masks_are_kernel_bitmaps() {
        assert_eq!(cpu_mask(2), "00000003");
        assert_eq!(cpu_mask(32), "ffffffff");
        assert_eq!(cpu_mask(33), "00000001,ffffffff");
    }
}
