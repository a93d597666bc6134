//! Which cell (interface) an MH is reached through, so per-cell wireless tuning
//! (`[[cell]]` in the config) applies to its connections. Read once at start from the
//! addresses of the configured cell interfaces: an MH whose address lies in a cell's
//! connected prefix belongs to that cell.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use itcp_config::IpPrefix;

#[derive(Debug, Default)]
pub struct CellMap {
    /// (connected prefix, interface, the interface's address in it).
    prefixes: Vec<(IpPrefix, String, IpAddr)>,
}

impl CellMap {
    /// Reads the connected prefixes of `interfaces` (getifaddrs).
    pub fn read<'a>(interfaces: impl Iterator<Item = &'a str>) -> CellMap {
        let wanted: Vec<&str> = interfaces.collect();
        let mut prefixes = Vec::new();
        if wanted.is_empty() {
            return CellMap { prefixes };
        }
        let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
            return CellMap { prefixes };
        };
        for ifa in addrs {
            if !wanted.contains(&ifa.interface_name.as_str()) {
                continue;
            }
            let (Some(a), Some(m)) = (ifa.address, ifa.netmask) else {
                continue;
            };
            let (addr, mask) = if let (Some(a), Some(m)) = (a.as_sockaddr_in(), m.as_sockaddr_in())
            {
                (IpAddr::V4(a.ip()), m.ip().to_bits().count_ones() as u8)
            } else if let (Some(a), Some(m)) = (a.as_sockaddr_in6(), m.as_sockaddr_in6()) {
                (IpAddr::V6(a.ip()), m.ip().to_bits().count_ones() as u8)
            } else {
                continue;
            };
            if let Some(net) = network(addr, mask) {
                prefixes.push((net, ifa.interface_name, addr));
            }
        }
        CellMap { prefixes }
    }

    /// The cell interface whose prefix holds `mh` (longest match), if any.
    pub fn interface_for(&self, mh: IpAddr) -> Option<&str> {
        self.prefixes
            .iter()
            .filter(|(p, ..)| p.contains(mh))
            .max_by_key(|(p, ..)| p.prefix_len())
            .map(|(_, n, _)| n.as_str())
    }

    /// Our address on `ifname` in the prefix that holds `mh` (longest match): the
    /// gateway an MH there routes through.
    pub fn gateway_for(&self, ifname: &str, mh: IpAddr) -> Option<IpAddr> {
        self.prefixes
            .iter()
            .filter(|(p, n, _)| n == ifname && p.contains(mh))
            .max_by_key(|(p, ..)| p.prefix_len())
            .map(|(.., a)| *a)
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
        let lo = |a: &str| m.gateway_for("lo", a.parse().unwrap());
        assert_eq!(lo("127.0.0.5"), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(lo("10.9.9.9"), None);
        assert_eq!(m.gateway_for("cell9", "127.0.0.5".parse().unwrap()), None);
        assert_eq!(
            network("10.2.0.7".parse().unwrap(), 24)
                .unwrap()
                .to_string(),
            "10.2.0.0/24"
        );
    }
}
