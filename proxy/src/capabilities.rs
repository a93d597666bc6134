//! msrd's capabilities: at start it keeps the few its work needs and drops every
//! other one from its permitted, effective and inheritable sets, and from the bounding
//! set when it may (CAP_SETPCAP). The kept ones are made ambient too, so that what msrd
//! starts — `nft`, `ip`, and the msrd of an upgrade — has them when msrd does not run
//! as root (its unit runs it as the `itcp` user).
//!
//! | capability | needed for (measured: docs/threat-model.md) |
//! |---|---|
//! | CAP_NET_ADMIN | TCP_REPAIR, IP_TRANSPARENT, nftables, NFQUEUE/NFLOG, rtnetlink (neighbours, proxy ARP, routes, MACs), `/proc/sys/net` writes, SO_RCVBUFFORCE |
//! | CAP_NET_RAW | packet sockets (greeting frames, gratuitous ARP), raw sockets (replayed segments) |
//! | CAP_NET_BIND_SERVICE | sockets restored or listening at ports below 1024 (a transparently intercepted connection to port 80 moves with its FH-side address) |
//! | CAP_SYS_RESOURCE | the fd limit past its hard limit; splice pipes of 1 MiB past `fs.pipe-user-pages-soft` (64 such pipes per user without it, then 8 KiB) |

use std::io;

/// Capability numbers (linux/capability.h).
pub const CAP_SETPCAP: u32 = 8;
pub const CAP_NET_BIND_SERVICE: u32 = 10;
pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_NET_RAW: u32 = 13;
pub const CAP_SYS_RESOURCE: u32 = 24;

/// What msrd keeps, as a set (bit `n`: capability `n`).
pub const KEPT: u64 =
    bit(CAP_NET_ADMIN) | bit(CAP_NET_RAW) | bit(CAP_NET_BIND_SERVICE) | bit(CAP_SYS_RESOURCE);

const fn bit(cap: u32) -> u64 {
    1 << cap
}

/// The sets of a process, as capget(2) gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sets {
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
}

/// What [`keep_only_needed`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// What msrd holds now (in every set, ambient included).
    pub kept: u64,
    /// What it needs and was not given.
    pub missing: u64,
    /// What it had and gave up.
    pub dropped: u64,
    /// The bounding set was cut to [`KEPT`] (false: no CAP_SETPCAP to do it).
    pub bounded: bool,
}

/// Keeps [`KEPT`] (what of it the process has) and drops everything else.
pub fn keep_only_needed() -> io::Result<Outcome> {
    let had = get()?;
    let kept = had.permitted & KEPT;
    let bounded = had.effective & bit(CAP_SETPCAP) != 0;
    if bounded {
        cut_bounding_set(KEPT)?;
    }
    let want = Sets {
        effective: kept,
        permitted: kept,
        inheritable: kept,
    };
    // Under its unit msrd starts with exactly these: no capset(2), which the unit's
    // system-call filter (~@privileged) refuses.
    if had != want {
        set(want)?;
    }
    make_ambient(kept)?;
    Ok(Outcome {
        kept,
        missing: KEPT & !kept,
        dropped: had.permitted & !kept,
        bounded,
    })
}

/// The names of a set's capabilities (`CAP_NET_ADMIN,CAP_NET_RAW`; numbers for those
/// msrd has no name for).
pub fn names(set: u64) -> String {
    (0..64)
        .filter(|c| set & (1 << c) != 0)
        .map(|c| match c {
            CAP_SETPCAP => "CAP_SETPCAP".to_string(),
            CAP_NET_BIND_SERVICE => "CAP_NET_BIND_SERVICE".to_string(),
            CAP_NET_ADMIN => "CAP_NET_ADMIN".to_string(),
            CAP_NET_RAW => "CAP_NET_RAW".to_string(),
            CAP_SYS_RESOURCE => "CAP_SYS_RESOURCE".to_string(),
            n => format!("cap{n}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[repr(C)]
struct Header {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set.
const VERSION_3: u32 = 0x2008_0522;

/// This thread's sets (capget(2)).
pub fn get() -> io::Result<Sets> {
    let mut h = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: a version 3 header and the two data words it fills.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let join = |f: fn(&Data) -> u32| u64::from(f(&d[0])) | u64::from(f(&d[1])) << 32;
    Ok(Sets {
        effective: join(|d| d.effective),
        permitted: join(|d| d.permitted),
        inheritable: join(|d| d.inheritable),
    })
}

/// Sets this process's sets (capset(2)); only ever lowers them here.
fn set(s: Sets) -> io::Result<()> {
    let mut h = Header {
        version: VERSION_3,
        pid: 0,
    };
    let word = |shift: u32| Data {
        effective: (s.effective >> shift) as u32,
        permitted: (s.permitted >> shift) as u32,
        inheritable: (s.inheritable >> shift) as u32,
    };
    let d = [word(0), word(32)];
    // SAFETY: a version 3 header and the two data words it reads.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Drops from the bounding set every capability outside `keep`, so that no program
/// msrd starts, root or setuid, regains one.
fn cut_bounding_set(keep: u64) -> io::Result<()> {
    for cap in (0..64u32).filter(|c| keep & bit(*c) == 0) {
        // SAFETY: prctl on this process.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            let e = io::Error::last_os_error();
            // EINVAL: past the kernel's last capability.
            if e.raw_os_error() == Some(libc::EINVAL) {
                return Ok(());
            }
            return Err(e);
        }
    }
    Ok(())
}

/// The ambient set becomes exactly `keep` (which must be permitted and inheritable).
fn make_ambient(keep: u64) -> io::Result<()> {
    let ambient = |op: libc::c_int, cap: u32| {
        // SAFETY: prctl on this process.
        let r = unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                op as libc::c_ulong,
                cap as libc::c_ulong,
                0,
                0,
            )
        };
        if r != 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    ambient(libc::PR_CAP_AMBIENT_CLEAR_ALL, 0)?;
    for cap in (0..64u32).filter(|c| keep & bit(*c) != 0) {
        ambient(libc::PR_CAP_AMBIENT_RAISE, cap)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_set_is_the_four_network_and_resource_capabilities() {
        assert_eq!(KEPT, 0x0100_3400);
        assert_eq!(
            names(KEPT),
            "CAP_NET_BIND_SERVICE,CAP_NET_ADMIN,CAP_NET_RAW,CAP_SYS_RESOURCE"
        );
        assert_eq!(names(1 << 21 | 1 << 8), "CAP_SETPCAP,cap21");
    }

    /// Dropping in a child process, whatever this one holds: every set ends up within
    /// KEPT, and a second call changes nothing.
    #[test]
    fn dropping_leaves_only_what_is_kept_and_is_idempotent() {
        // SAFETY: the child only makes syscalls and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let ok = (|| {
                let first = keep_only_needed().ok()?;
                let s = get().ok()?;
                let second = keep_only_needed().ok()?;
                let within = |x: u64| x & !KEPT == 0;
                (within(s.permitted)
                    && s.effective == s.permitted
                    && s.inheritable == s.permitted
                    && s.permitted == first.kept
                    && second.kept == first.kept
                    && second.dropped == 0)
                    .then_some(())
            })()
            .is_some();
            // SAFETY: leave the child without running the parent's test harness.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
