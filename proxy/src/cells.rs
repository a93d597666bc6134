//! Which cell (interface) an MH is reached through, so per-cell wireless tuning
//! (`[[cell]]` in the config) applies to its connections. Read once at start from the
//! addresses of the configured cell interfaces: an MH whose address lies in a cell's
//! connected prefix belongs to that cell.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use itcp_config::IpPrefix;

#[derive(Debug, Default)]
pub struct CellMap {
    prefixes: Vec<(IpPrefix, String)>,
}

impl CellMap {
    /// Reads the connected prefixes of `interfaces` (getifaddrs).
    pub fn read<'a>(interfaces: impl Iterator<Item = &'a str>) -> CellMap {
        let wanted: Vec<&str> = interfaces.collect();
        let mut prefixes = Vec::new();
        if wanted.is_empty() {
            return CellMap { prefixes };
        }
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: getifaddrs fills head with a list we free below.
        if unsafe { libc::getifaddrs(&mut head) } != 0 {
            return CellMap { prefixes };
        }
        let mut p = head;
        while !p.is_null() {
            // SAFETY: p walks the list getifaddrs returned; fields are valid or null.
            let ifa = unsafe { &*p };
            p = ifa.ifa_next;
            if ifa.ifa_addr.is_null() || ifa.ifa_netmask.is_null() {
                continue;
            }
            // SAFETY: ifa_name is a NUL-terminated string.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
            if !wanted.contains(&name.as_ref()) {
                continue;
            }
            // SAFETY: the sockaddr family tells which struct it is.
            let (addr, mask) = unsafe {
                match i32::from((*ifa.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let a = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        let m = &*(ifa.ifa_netmask as *const libc::sockaddr_in);
                        (
                            IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))),
                            u32::from_be(m.sin_addr.s_addr).count_ones() as u8,
                        )
                    }
                    libc::AF_INET6 => {
                        let a = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        let m = &*(ifa.ifa_netmask as *const libc::sockaddr_in6);
                        (
                            IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr)),
                            m.sin6_addr
                                .s6_addr
                                .iter()
                                .map(|b| b.count_ones())
                                .sum::<u32>() as u8,
                        )
                    }
                    _ => continue,
                }
            };
            if let Some(net) = network(addr, mask) {
                prefixes.push((net, name.to_string()));
            }
        }
        // SAFETY: head came from getifaddrs.
        unsafe { libc::freeifaddrs(head) };
        CellMap { prefixes }
    }

    /// The cell interface whose prefix holds `mh` (longest match), if any.
    pub fn interface_for(&self, mh: IpAddr) -> Option<&str> {
        self.prefixes
            .iter()
            .filter(|(p, _)| p.contains(mh))
            .max_by_key(|(p, _)| p.prefix_len())
            .map(|(_, n)| n.as_str())
    }
}

/// The network prefix of an interface address.
fn network(addr: IpAddr, len: u8) -> Option<IpPrefix> {
    let masked = match addr {
        IpAddr::V4(a) => {
            let m = if len == 0 {
                0
            } else {
                u32::MAX << (32 - len as u32)
            };
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
        }
        IpAddr::V6(a) => {
            let m = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len as u32)
            };
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
        }
    };
    IpPrefix::new(masked, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found() {
        let m = CellMap::read(["lo"].into_iter());
        assert_eq!(m.interface_for("127.0.0.5".parse().unwrap()), Some("lo"));
        assert_eq!(m.interface_for("10.9.9.9".parse().unwrap()), None);
        assert_eq!(
            network("10.2.0.7".parse().unwrap(), 24)
                .unwrap()
                .to_string(),
            "10.2.0.0/24"
        );
    }
}
