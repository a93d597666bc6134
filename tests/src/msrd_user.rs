//! msrd run as an unprivileged user with ambient capabilities, as its systemd unit
//! runs it (`User=itcp`, `AmbientCapabilities=`), instead of as the lab's root.
//!
//! `ITCP_LAB_MSRD_USER=UID[:GID]` (or a user name) turns it on for every lab of the
//! process; `ITCP_LAB_MSRD_CAPS=net_admin,net_raw,…` chooses the capabilities (default
//! [`UNIT_CAPS`], the unit's set). The user needs no passwd entry.

use std::ffi::CString;
use std::io;
use std::path::Path;

/// Capability numbers (linux/capability.h) of the names msrd's unit uses.
const NAMES: &[(&str, u32)] = &[
    ("net_bind_service", 10),
    ("net_admin", 12),
    ("net_raw", 13),
    ("sys_resource", 24),
];

/// The capabilities `deploy/msrd.service` gives msrd.
pub const UNIT_CAPS: &str = "net_admin,net_raw,net_bind_service,sys_resource";

/// The user msrd runs as, and the capabilities it keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MsrdUser {
    pub uid: u32,
    pub gid: u32,
    /// Bit `n` set: capability `n` is kept (bounding, permitted, effective,
    /// inheritable and ambient sets).
    pub caps: u64,
}

impl MsrdUser {
    /// From `ITCP_LAB_MSRD_USER` and `ITCP_LAB_MSRD_CAPS`; None when the first is unset.
    pub fn from_env() -> io::Result<Option<MsrdUser>> {
        let Some(user) = std::env::var_os("ITCP_LAB_MSRD_USER") else {
            return Ok(None);
        };
        let caps = std::env::var("ITCP_LAB_MSRD_CAPS").unwrap_or_else(|_| UNIT_CAPS.into());
        let (uid, gid) = parse_user(&user.to_string_lossy())?;
        Ok(Some(MsrdUser {
            uid,
            gid,
            caps: parse_caps(&caps)?,
        }))
    }

    /// Gives the user the lab directory's files (configs, certificates, the control
    /// socket's directory), as the unit's RuntimeDirectory and LogsDirectory do.
    pub fn own(&self, dir: &Path) -> io::Result<()> {
        std::os::unix::fs::lchown(dir, Some(self.uid), Some(self.gid))?;
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            if p.symlink_metadata()?.is_dir() {
                self.own(&p)?;
            } else {
                std::os::unix::fs::lchown(&p, Some(self.uid), Some(self.gid))?;
            }
        }
        Ok(())
    }

    /// In the child between fork and exec, as root: the bounding set cut to the kept
    /// capabilities, then uid and gid changed with those kept in every set, ambient
    /// included, so that msrd gets them across exec. Only async-signal-safe calls.
    /// Capabilities the lab itself lacks (a container's bounding set) are left out.
    pub fn become_it(&self) -> io::Result<()> {
        let mut kept = 0u64;
        for cap in 0..64 {
            // SAFETY: prctl on this process; EINVAL (-1) beyond the last capability.
            let held = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) } == 1;
            if held && self.caps & (1 << cap) != 0 {
                kept |= 1 << cap;
            } else if held {
                // SAFETY: as above.
                check(unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) })?;
            }
        }
        // SAFETY: plain syscalls on this process with valid arguments.
        unsafe {
            check(libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0))?;
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setresgid(self.gid, self.gid, self.gid))?;
            check(libc::setresuid(self.uid, self.uid, self.uid))?;
        }
        set_caps(kept)?;
        for cap in (0..64).filter(|c| kept & (1 << c) != 0) {
            // SAFETY: as above.
            check(unsafe {
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_RAISE,
                    cap as libc::c_ulong,
                    0,
                    0,
                )
            })?;
        }
        // A change of uid clears the parent-death signal: msrd still dies with the lab.
        // SAFETY: as above.
        check(unsafe {
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            )
        })
    }
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// capset(2): permitted, effective and inheritable all `caps`.
fn set_caps(caps: u64) -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut h = Header {
        version: VERSION_3,
        pid: 0,
    };
    let word = |w: u32| Data {
        effective: w,
        permitted: w,
        inheritable: w,
    };
    let d = [word(caps as u32), word((caps >> 32) as u32)];
    // SAFETY: header and two data words, as version 3 of the call takes them.
    check(unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) } as libc::c_int)
}

fn parse_user(s: &str) -> io::Result<(u32, u32)> {
    let bad = || {
        io::Error::other(format!(
            "ITCP_LAB_MSRD_USER={s:?}: want UID[:GID] or a user"
        ))
    };
    if let Some((u, g)) = s.split_once(':') {
        return Ok((u.parse().map_err(|_| bad())?, g.parse().map_err(|_| bad())?));
    }
    if let Ok(uid) = s.parse() {
        return Ok((uid, uid));
    }
    let name = CString::new(s).map_err(|_| bad())?;
    // SAFETY: a NUL-terminated name; the entry is read before any other getpw call.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err(bad());
    }
    // SAFETY: non-null, just returned.
    Ok(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

fn parse_caps(s: &str) -> io::Result<u64> {
    let mut caps = 0;
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let name = name.to_ascii_lowercase();
        let name = name.strip_prefix("cap_").unwrap_or(&name);
        let Some(&(_, n)) = NAMES.iter().find(|(k, _)| *k == name) else {
            return Err(io::Error::other(format!(
                "ITCP_LAB_MSRD_CAPS: unknown capability {name:?} (known: {UNIT_CAPS})"
            )));
        };
        caps |= 1 << n;
    }
    Ok(caps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_and_capabilities_parse() {
        assert_eq!(parse_user("1234").unwrap(), (1234, 1234));
        assert_eq!(parse_user("1234:99").unwrap(), (1234, 99));
        assert_eq!(parse_user("root").unwrap(), (0, 0));
        assert!(parse_user("1:x").is_err());
        assert_eq!(
            parse_caps(UNIT_CAPS).unwrap(),
            1 << 10 | 1 << 12 | 1 << 13 | 1 << 24
        );
        assert_eq!(parse_caps("CAP_NET_RAW,").unwrap(), 1 << 13);
        assert_eq!(parse_caps("").unwrap(), 0);
        assert!(parse_caps("sys_admin").is_err());
    }
}
