//! Thin safe wrappers over the few raw syscalls the testbed needs: the monotonic clock,
//! entering network namespaces, TAP devices, and a precise poll.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// CLOCK_MONOTONIC in nanoseconds. Every namespace shares this clock, so times from
/// airlink, ttcp and the lab line up.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Runs `f` with the calling thread inside network namespace `netns` (a name under
/// /run/netns), then returns the thread to the namespace it was in. Sockets and devices
/// created inside `f` stay in `netns`.
pub fn in_netns<T>(netns: &str, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let home = File::open("/proc/thread-self/ns/net")?;
    let target = File::open(format!("/run/netns/{netns}"))
        .map_err(|e| io::Error::new(e.kind(), format!("network namespace {netns}: {e}")))?;
    // SAFETY: both fds are open namespace files; setns only affects this thread.
    check(unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) })?;
    let r = f();
    // SAFETY: as above. Failing to return would leave the thread in the wrong
    // namespace, which is not recoverable.
    let back = unsafe { libc::setns(home.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(
        back, 0,
        "could not return to the original network namespace"
    );
    r
}

#[repr(C)]
struct IfReqFlags {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

#[repr(C)]
struct IfReqHwaddr {
    name: [libc::c_char; libc::IFNAMSIZ],
    addr: libc::sockaddr,
    _pad: [u8; 8],
}

fn ifname_bytes(name: &str) -> io::Result<[libc::c_char; libc::IFNAMSIZ]> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name:?} must be 1..15 bytes"),
        ));
    }
    let mut out = [0 as libc::c_char; libc::IFNAMSIZ];
    for (o, b) in out.iter_mut().zip(name.bytes()) {
        *o = b as libc::c_char;
    }
    Ok(out)
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// Sends `packet`, a whole IPv4 or IPv6 packet, as it is (a raw socket: the tests'
/// stray or forged segments), from the calling thread's namespace.
pub fn send_raw(packet: &[u8]) -> io::Result<()> {
    let v6 = packet.first().is_some_and(|b| b >> 4 == 6);
    let (family, dst_at, len) = if v6 {
        (libc::AF_INET6, 24, 16)
    } else {
        (libc::AF_INET, 16, 4)
    };
    if packet.len() < dst_at + len {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "short packet"));
    }
    // SAFETY: a new socket, owned (and closed) by `fd`.
    let fd = unsafe {
        OwnedFd::from_raw_fd(check(libc::socket(
            family,
            libc::SOCK_RAW,
            libc::IPPROTO_RAW,
        ))?)
    };
    // SAFETY: zeroed sockaddr_storage is a valid "any" address to fill in.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let sa_len = if v6 {
        // SAFETY: sockaddr_storage is large enough for sockaddr_in6.
        let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
        sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        sin6.sin6_addr
            .s6_addr
            .copy_from_slice(&packet[dst_at..dst_at + len]);
        std::mem::size_of::<libc::sockaddr_in6>()
    } else {
        // SAFETY: sockaddr_storage is large enough for sockaddr_in.
        let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_addr.s_addr = u32::from_ne_bytes(packet[dst_at..dst_at + len].try_into().unwrap());
        std::mem::size_of::<libc::sockaddr_in>()
    };
    // SAFETY: the buffer and the address are valid for the lengths given.
    let n = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            packet.as_ptr().cast(),
            packet.len(),
            0,
            &ss as *const _ as *const libc::sockaddr,
            sa_len as libc::socklen_t,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Creates a TAP device (Ethernet frames, no packet-info header) in the current network
/// namespace, non-blocking. It disappears when the returned fd is closed.
pub fn open_tap(ifname: &str) -> io::Result<OwnedFd> {
    let path = CString::new("/dev/net/tun").unwrap();
    // SAFETY: path is NUL-terminated; the returned fd is owned below.
    let fd = check(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fd was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReqFlags {
        name: ifname_bytes(ifname)?,
        flags: (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    // SAFETY: TUNSETIFF reads/writes an ifreq, which IfReqFlags lays out (40 bytes).
    check(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut req) })
        .map_err(|e| io::Error::new(e.kind(), format!("TUNSETIFF {ifname}: {e}")))?;
    Ok(fd)
}

const TUNSETCARRIER: libc::c_ulong = 0x4004_54e2;

/// Turns the carrier of a TAP device on or off (TUNSETCARRIER, Linux ≥ 4.18), as a NIC
/// does when it gains or loses its link: the kernel reports the change on rtnetlink
/// (IFF_LOWER_UP), and transmits nothing while it is off.
pub fn set_carrier(tap: RawFd, on: bool) -> io::Result<()> {
    let v: libc::c_int = on.into();
    // SAFETY: TUNSETCARRIER reads one int through the pointer, which lives across the call.
    check(unsafe { libc::ioctl(tap, TUNSETCARRIER, &v) })
        .map_err(|e| io::Error::new(e.kind(), format!("TUNSETCARRIER {on}: {e}")))?;
    Ok(())
}

/// Sets the MAC address of `ifname` in the current network namespace.
pub fn set_mac(ifname: &str, mac: [u8; 6]) -> io::Result<()> {
    // SAFETY: plain socket creation; owned below.
    let s =
        check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: s is a fresh fd.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    let mut addr: libc::sockaddr = unsafe { std::mem::zeroed() };
    addr.sa_family = libc::ARPHRD_ETHER;
    for (d, b) in addr.sa_data.iter_mut().zip(mac) {
        *d = b as libc::c_char;
    }
    let req = IfReqHwaddr {
        name: ifname_bytes(ifname)?,
        addr,
        _pad: [0; 8],
    };
    // SAFETY: SIOCSIFHWADDR reads an ifreq with ifr_hwaddr, laid out by IfReqHwaddr.
    check(unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSIFHWADDR, &req) })
        .map_err(|e| io::Error::new(e.kind(), format!("set MAC of {ifname}: {e}")))?;
    Ok(())
}

/// Asks for the finest timer slack, so ppoll wakes within microseconds of its deadline.
pub fn set_fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// Puts the calling process in the lowest real-time class (SCHED_FIFO, priority 1),
/// so that its wake-ups preempt ordinary processes. The emulator needs it: on a busy
/// machine (a test suite building and running beside it) an ordinary process can wait
/// milliseconds for a core, and a frame delivered 10 ms late on a 1 ms link makes its
/// sender retransmit what was not lost. Needs root (CAP_SYS_NICE); the kernel's RT
/// throttling still leaves other processes 5 % of each core if it spins.
pub fn set_realtime() -> io::Result<()> {
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: a valid sched_param for the calling process (pid 0).
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the calling process receive `sig` when its parent dies, so helpers never
/// outlive the test or lab that started them.
pub fn die_with_parent(sig: libc::c_int) {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) };
}

/// Waits until one of `fds` is readable or `timeout_ns` passes (None: forever).
/// Returns the indices of readable fds.
pub fn poll_readable(fds: &[RawFd], timeout_ns: Option<u64>) -> io::Result<Vec<usize>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = timeout_ns.map(|t| libc::timespec {
        tv_sec: (t / 1_000_000_000) as libc::time_t,
        tv_nsec: (t % 1_000_000_000) as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: pfds is a valid array of its length; tsp is null or points to ts.
    let n = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(Vec::new());
        }
        return Err(e);
    }
    Ok(pfds
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
        .map(|(i, _)| i)
        .collect())
}

/// Non-blocking read; Ok(None) when nothing is waiting.
pub fn read_nb(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: buf is valid for buf.len() bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(n as usize))
}

/// Writes one whole frame; a TAP write is atomic (all or error).
pub fn write_frame(fd: RawFd, frame: &[u8]) -> io::Result<()> {
    // SAFETY: frame is valid for frame.len() bytes.
    let n = unsafe { libc::write(fd, frame.as_ptr().cast(), frame.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// True if a process with this pid exists.
pub fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Lifts the open-file limit to `fs.nr_open` (root) or the hard limit: benchmarks hold
/// tens of thousands of sockets.
pub fn raise_nofile_limit() {
    let nr_open: libc::rlim_t = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid in/out pointer.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        let want = libc::rlimit {
            rlim_cur: nr_open.max(r.rlim_max),
            rlim_max: nr_open.max(r.rlim_max),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &want) != 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}
