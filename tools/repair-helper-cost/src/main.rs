//! Micro-benchmark: TCP_REPAIR on/off for N established loopback sockets,
//! (A) directly in-process vs (B) via a passt-repair style helper process
//! that receives the fds over AF_UNIX SOCK_SEQPACKET with SCM_RIGHTS
//! (batches of at most SCM_MAX_FD = 253), does the setsockopt, closes its
//! copies and replies with one byte.
//!
//! Usage: repair-helper-cost [runs] [N...]   (default: 41 runs, N = 1 100 1000)
//! Needs CAP_NET_ADMIN (run as root).

use std::io::Write;
use std::mem::{size_of, zeroed};
use std::time::Instant;

const SCM_MAX_FD: usize = 253;
const TCP_REPAIR_ON: libc::c_int = 1;
const TCP_REPAIR_OFF: libc::c_int = 0;

fn die(what: &str) -> ! {
    let e = std::io::Error::last_os_error();
    eprintln!("{what}: {e}");
    std::process::exit(1);
}

fn set_repair(fd: libc::c_int, val: libc::c_int) -> libc::c_int {
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_REPAIR,
            &val as *const _ as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(255)
    } else {
        0
    }
}

fn get_repair(fd: libc::c_int) -> libc::c_int {
    let mut v: libc::c_int = -1;
    let mut l = size_of::<libc::c_int>() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_REPAIR,
            &mut v as *mut _ as *mut libc::c_void,
            &mut l,
        )
    };
    if r < 0 {
        die("getsockopt TCP_REPAIR");
    }
    v
}

/// Create N established pairs on 127.0.0.1. Returns (client fds, accepted fds).
fn make_pairs(n: usize) -> (Vec<libc::c_int>, Vec<libc::c_int>) {
    unsafe {
        let l = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        if l < 0 {
            die("socket");
        }
        let one: libc::c_int = 1;
        libc::setsockopt(
            l,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            &one as *const _ as *const libc::c_void,
            4,
        );
        let mut sa: libc::sockaddr_in = zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        sa.sin_port = 0;
        if libc::bind(
            l,
            &sa as *const _ as *const libc::sockaddr,
            size_of::<libc::sockaddr_in>() as u32,
        ) < 0
        {
            die("bind");
        }
        if libc::listen(l, 4096) < 0 {
            die("listen");
        }
        let mut sl = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        libc::getsockname(l, &mut sa as *mut _ as *mut libc::sockaddr, &mut sl);
        let mut cs = Vec::with_capacity(n);
        let mut ss = Vec::with_capacity(n);
        // connect in chunks so the accept backlog never overflows
        let mut done = 0;
        while done < n {
            let chunk = (n - done).min(256);
            for _ in 0..chunk {
                let c = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                if c < 0 {
                    die("socket(client)");
                }
                if libc::connect(
                    c,
                    &sa as *const _ as *const libc::sockaddr,
                    size_of::<libc::sockaddr_in>() as u32,
                ) < 0
                {
                    die("connect");
                }
                cs.push(c);
            }
            for _ in 0..chunk {
                let s = libc::accept(l, std::ptr::null_mut(), std::ptr::null_mut());
                if s < 0 {
                    die("accept");
                }
                ss.push(s);
            }
            done += chunk;
        }
        libc::close(l);
        (cs, ss)
    }
}

// ---------------------------------------------------------------- helper side

fn helper_loop(sock: libc::c_int) -> ! {
    unsafe {
        let cmsg_space = libc::CMSG_SPACE((SCM_MAX_FD * size_of::<libc::c_int>()) as u32) as usize;
        let mut cbuf = vec![0u8; cmsg_space];
        loop {
            let mut cmd: u8 = 0;
            let mut iov = libc::iovec {
                iov_base: &mut cmd as *mut u8 as *mut libc::c_void,
                iov_len: 1,
            };
            let mut msg: libc::msghdr = zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = cmsg_space as _;
            let r = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if r <= 0 {
                libc::_exit(0);
            }
            let val = if cmd == 1 {
                TCP_REPAIR_ON
            } else {
                TCP_REPAIR_OFF
            };
            let mut status: u8 = 0;
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let nfd = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                        / size_of::<libc::c_int>();
                    let p = libc::CMSG_DATA(c) as *const libc::c_int;
                    for i in 0..nfd {
                        let fd = std::ptr::read_unaligned(p.add(i));
                        let e = set_repair(fd, val);
                        if e != 0 && status == 0 {
                            status = e as u8;
                        }
                        libc::close(fd);
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
            if libc::send(sock, &status as *const u8 as *const libc::c_void, 1, 0) != 1 {
                libc::_exit(1);
            }
        }
    }
}

fn spawn_helper() -> (libc::c_int, libc::pid_t) {
    unsafe {
        let mut sv = [0 as libc::c_int; 2];
        if libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        ) < 0
        {
            die("socketpair");
        }
        let pid = libc::fork();
        if pid < 0 {
            die("fork");
        }
        if pid == 0 {
            libc::close(sv[0]);
            // Close everything else the helper inherited (like a fresh helper would be).
            for fd in 3..20000 {
                if fd != sv[1] {
                    libc::close(fd);
                }
            }
            helper_loop(sv[1]);
        }
        libc::close(sv[1]);
        (sv[0], pid)
    }
}

// ------------------------------------------------------------------ main side

/// One round trip: send `fds` (<= 253) with command byte, wait for 1-byte reply.
fn helper_batch(sock: libc::c_int, fds: &[libc::c_int], on: bool, cbuf: &mut [u8]) {
    unsafe {
        let mut cmd: u8 = on as u8;
        let mut iov = libc::iovec {
            iov_base: &mut cmd as *mut u8 as *mut libc::c_void,
            iov_len: 1,
        };
        let mut msg: libc::msghdr = zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        let dlen = std::mem::size_of_val(fds);
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = libc::CMSG_SPACE(dlen as u32) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(dlen as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr() as *const u8, libc::CMSG_DATA(c), dlen);
        if libc::sendmsg(sock, &msg, 0) != 1 {
            die("sendmsg");
        }
        let mut st: u8 = 0xff;
        if libc::recv(sock, &mut st as *mut u8 as *mut libc::c_void, 1, 0) != 1 {
            die("recv reply");
        }
        if st != 0 {
            eprintln!("helper setsockopt failed: errno {st}");
            std::process::exit(1);
        }
    }
}

fn cycle_direct(fds: &[libc::c_int]) -> f64 {
    let t = Instant::now();
    for &fd in fds {
        if set_repair(fd, TCP_REPAIR_ON) != 0 {
            die("TCP_REPAIR on");
        }
    }
    for &fd in fds {
        if set_repair(fd, TCP_REPAIR_OFF) != 0 {
            die("TCP_REPAIR off");
        }
    }
    t.elapsed().as_secs_f64() * 1e6
}

fn cycle_helper(sock: libc::c_int, fds: &[libc::c_int], cbuf: &mut [u8]) -> f64 {
    let t = Instant::now();
    for b in fds.chunks(SCM_MAX_FD) {
        helper_batch(sock, b, true, cbuf);
    }
    for b in fds.chunks(SCM_MAX_FD) {
        helper_batch(sock, b, false, cbuf);
    }
    t.elapsed().as_secs_f64() * 1e6
}

fn stats(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    let med = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (med, v[0], v[n - 1])
}

/// Privilege check: in a forked child that has dropped CAP_NET_ADMIN, which repair
/// operations still work on a socket that a privileged process put into repair mode?
fn privcheck() {
    let (cs, ss) = make_pairs(1);
    let fd = ss[0];
    unsafe {
        // queue some data so MSG_PEEK has something to read
        let sent = libc::send(cs[0], b"hello".as_ptr() as *const libc::c_void, 5, 0);
        println!("# privcheck: sent {sent} bytes client->server before repair");
        std::thread::sleep(std::time::Duration::from_millis(10));
        if set_repair(fd, TCP_REPAIR_ON) != 0 {
            die("repair on (privileged)");
        }
        {
            let q: libc::c_int = 1; // TCP_RECV_QUEUE
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_REPAIR_QUEUE,
                &q as *const _ as *const libc::c_void,
                4,
            );
            let mut buf = [0u8; 64];
            let n = libc::recv(
                fd,
                buf.as_mut_ptr() as *mut libc::c_void,
                64,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            );
            let mut inq: libc::c_int = -1;
            libc::ioctl(fd, libc::FIONREAD, &mut inq);
            println!("# privcheck (with CAP_NET_ADMIN, reference): recv MSG_PEEK recv-queue -> {n} (SIOCINQ {inq})");
        }
        let pid = libc::fork();
        if pid == 0 {
            #[repr(C)]
            struct Hdr {
                version: u32,
                pid: i32,
            }
            #[repr(C)]
            #[derive(Clone, Copy)]
            struct Data {
                eff: u32,
                perm: u32,
                inh: u32,
            }
            let mut h = Hdr {
                version: 0x20080522,
                pid: 0,
            };
            let mut d = [Data {
                eff: 0,
                perm: 0,
                inh: 0,
            }; 2];
            libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr());
            let bit = 1u32 << 12 /* CAP_NET_ADMIN */;
            d[0].eff &= !bit;
            d[0].perm &= !bit;
            d[0].inh &= !bit;
            if libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) != 0 {
                die("capset");
            }
            let r = |name: &str, e: i32| {
                println!(
                    "# privcheck (no CAP_NET_ADMIN): {name}: {}",
                    if e == 0 {
                        "ok".to_string()
                    } else {
                        format!("errno {e} ({})", std::io::Error::from_raw_os_error(e))
                    }
                )
            };
            let err = |rc: isize| {
                if rc < 0 {
                    std::io::Error::last_os_error().raw_os_error().unwrap()
                } else {
                    0
                }
            };
            // fd 'fd' is in repair mode (set by privileged parent before fork)
            let q: libc::c_int = 1; // TCP_RECV_QUEUE (enum: NO=0, RECV=1, SEND=2)
            r(
                "setsockopt TCP_REPAIR_QUEUE=RECV",
                err(libc::setsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_REPAIR_QUEUE,
                    &q as *const _ as *const libc::c_void,
                    4,
                ) as isize),
            );
            let mut seq: u32 = 0;
            let mut l: libc::socklen_t = 4;
            r(
                "getsockopt TCP_QUEUE_SEQ",
                err(libc::getsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    21,
                    &mut seq as *mut _ as *mut libc::c_void,
                    &mut l,
                ) as isize),
            );
            let mut buf = [0u8; 64];
            let n = libc::recv(
                fd,
                buf.as_mut_ptr() as *mut libc::c_void,
                64,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            );
            r(&format!("recv MSG_PEEK recv-queue ({n} bytes)"), err(n));
            let mut w = [0u32; 8];
            let mut wl: libc::socklen_t = 20;
            r(
                "getsockopt TCP_REPAIR_WINDOW",
                err(libc::getsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_REPAIR_WINDOW,
                    w.as_mut_ptr() as *mut libc::c_void,
                    &mut wl,
                ) as isize),
            );
            r(
                "setsockopt TCP_REPAIR=0 (off)",
                set_repair(fd, TCP_REPAIR_OFF),
            );
            r(
                "setsockopt TCP_REPAIR=1 on other socket",
                set_repair(cs[0], TCP_REPAIR_ON),
            );
            libc::_exit(0);
        }
        // parent: repair on before the child starts poking (child sleeps implicitly via ordering)
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
        let _ = set_repair(fd, TCP_REPAIR_OFF);
        libc::close(cs[0]);
        libc::close(fd);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(|s| s.as_str()) == Some("privcheck") {
        privcheck();
        return;
    }
    let runs: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(41);
    let ns: Vec<usize> = if args.len() > 2 {
        args[2..].iter().map(|s| s.parse().unwrap()).collect()
    } else {
        vec![1, 100, 1000]
    };
    let maxn = *ns.iter().max().unwrap();

    unsafe {
        // best effort: raise soft limit to the hard limit (need ~2N+few fds)
        let mut rl: libc::rlimit = zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
        rl.rlim_cur = rl.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
    }

    let (helper_sock, helper_pid) = spawn_helper();
    let mut cbuf = vec![0u8; unsafe { libc::CMSG_SPACE((SCM_MAX_FD * 4) as u32) } as usize];
    let out = std::io::stdout();
    let mut o = out.lock();

    writeln!(
        o,
        "# repair-helper-cost: runs={runs} ns={ns:?} kernel={}",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    )
    .unwrap();
    writeln!(
        o,
        "# A = direct setsockopt(TCP_REPAIR 1 then 0) on each fd in-process"
    )
    .unwrap();
    writeln!(o, "# B = helper via SOCK_SEQPACKET + SCM_RIGHTS, <= {SCM_MAX_FD} fds/msg, 1-byte reply; round trips per cycle = 2*ceil(N/{SCM_MAX_FD})").unwrap();
    writeln!(
        o,
        "# times in microseconds for one full on+off cycle over all N sockets"
    )
    .unwrap();

    for &n in &ns {
        let (cs, ss) = make_pairs(n);
        let fds = &ss[..]; // accepted (server-side) sockets, like msrd's

        // Sanity: helper really toggles repair on the shared socket (same open file description).
        for b in fds.chunks(SCM_MAX_FD) {
            helper_batch(helper_sock, b, true, &mut cbuf);
        }
        let on_ok = fds.iter().all(|&fd| get_repair(fd) == 1);
        for b in fds.chunks(SCM_MAX_FD) {
            helper_batch(helper_sock, b, false, &mut cbuf);
        }
        let off_ok = fds.iter().all(|&fd| get_repair(fd) == 0);
        writeln!(
            o,
            "# N={n}: sanity helper-on visible in main: {on_ok}, helper-off visible: {off_ok}"
        )
        .unwrap();

        // warm-up
        for _ in 0..3 {
            cycle_direct(fds);
            cycle_helper(helper_sock, fds, &mut cbuf);
        }

        let mut a = Vec::with_capacity(runs);
        let mut b = Vec::with_capacity(runs);
        for i in 0..runs {
            // alternate A,B / B,A so any ordering bias cancels too
            if i % 2 == 0 {
                a.push(cycle_direct(fds));
                b.push(cycle_helper(helper_sock, fds, &mut cbuf));
            } else {
                b.push(cycle_helper(helper_sock, fds, &mut cbuf));
                a.push(cycle_direct(fds));
            }
        }
        writeln!(
            o,
            "raw N={n} A {}",
            a.iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        )
        .unwrap();
        writeln!(
            o,
            "raw N={n} B {}",
            b.iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        )
        .unwrap();
        let (am, amin, amax) = stats(&mut a);
        let (bm, bmin, bmax) = stats(&mut b);
        let d = bm - am;
        writeln!(
            o,
            "N={n:5} direct {am:9.1} ({amin:.1}-{amax:.1}) us | helper {bm:9.1} ({bmin:.1}-{bmax:.1}) us | helper-direct {d:8.1} us = {:.2}% of 1.1 ms, {:.3}% of 135 ms | per-socket direct {:.3} us helper {:.3} us",
            d / 1100.0 * 100.0,
            d / 135000.0 * 100.0,
            am / n as f64,
            bm / n as f64
        )
        .unwrap();
        o.flush().unwrap();
        for fd in cs.into_iter().chain(ss) {
            unsafe { libc::close(fd) };
        }
        let _ = maxn;
    }

    unsafe {
        libc::close(helper_sock);
        let mut st = 0;
        libc::waitpid(helper_pid, &mut st, 0);
    }
}
