//! [`IpPrefix`]: an IPv4 or IPv6 network prefix (`10.2.0.0/24`, `2001:db8::/64`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// An IPv4 or IPv6 network prefix: an address and a prefix length.
///
/// The address is always the network address (host bits zero). Parsing is strict:
/// `"10.2.0.1/24"` is rejected because its host bits are set, which in an access list
/// is more often a typo than intent. A bare address (`"10.2.0.7"`) is the host prefix
/// (`/32` or `/128`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpPrefix {
    addr: IpAddr,
    len: u8,
}

/// Why a string is not an [`IpPrefix`]; its `Display` quotes the string and says why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsePrefixError {
    input: String,
    reason: String,
}

impl fmt::Display for ParsePrefixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not an IP prefix ({})", self.input, self.reason)
    }
}

impl std::error::Error for ParsePrefixError {}

fn max_len(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

fn mask(addr: IpAddr, len: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
        }
    }
}

impl IpPrefix {
    /// Builds a prefix, clearing any host bits of `addr`; `None` if `len` is longer than
    /// the address family allows (32 for IPv4, 128 for IPv6).
    pub fn new(addr: IpAddr, len: u8) -> Option<IpPrefix> {
        (len <= max_len(addr)).then(|| IpPrefix {
            addr: mask(addr, len),
            len,
        })
    }

    /// The prefix that holds exactly one address (`/32` or `/128`).
    pub fn host(addr: IpAddr) -> IpPrefix {
        IpPrefix {
            addr,
            len: max_len(addr),
        }
    }

    /// The network address (host bits zero).
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length in bits.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// True for an IPv4 prefix.
    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// True for an IPv6 prefix.
    pub fn is_ipv6(&self) -> bool {
        self.addr.is_ipv6()
    }

    /// Whether `ip` lies in this prefix. IPv4-mapped IPv6 addresses (`::ffff:10.2.0.7`,
    /// as a dual-stack socket reports IPv4 peers) match the IPv4 prefix they map to.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match (self.addr, ip) {
            (IpAddr::V4(_), IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => return false,
            },
            (IpAddr::V6(_), IpAddr::V4(v4)) => IpAddr::V6(v4.to_ipv6_mapped()),
            _ => ip,
        };
        mask(ip, self.len) == self.addr
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for IpPrefix {
    type Err = ParsePrefixError;

    fn from_str(s: &str) -> Result<IpPrefix, ParsePrefixError> {
        let err = |reason: String| ParsePrefixError {
            input: s.to_owned(),
            reason,
        };
        let (addr_text, len_text) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr_text.parse().map_err(|_| {
            err(format!(
                "{addr_text:?} is not an IPv4 or IPv6 address; expected e.g. \"10.2.0.0/24\" or \"2001:db8::/64\""
            ))
        })?;
        let family = if addr.is_ipv4() { "IPv4" } else { "IPv6" };
        let max = max_len(addr);
        let Some(len_text) = len_text else {
            return Ok(IpPrefix::host(addr));
        };
        let len = match len_text.parse::<u8>() {
            Ok(len) if len <= max && !len_text.starts_with('+') => len,
            _ => return Err(err(format!("prefix length must be 0..={max} for {family}"))),
        };
        let prefix = IpPrefix::new(addr, len).expect("length checked above");
        if prefix.addr != addr {
            return Err(err(format!(
                "host bits are set; did you mean \"{prefix}\"?"
            )));
        }
        Ok(prefix)
    }
}

impl<'de> Deserialize<'de> for IpPrefix {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<IpPrefix, D::Error> {
        struct PrefixVisitor;
        impl Visitor<'_> for PrefixVisitor {
            type Value = IpPrefix;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an IP prefix string like \"10.2.0.0/24\" or \"2001:db8::/64\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<IpPrefix, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(PrefixVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> IpPrefix {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_and_displays_both_families() {
        assert_eq!(p("10.2.0.0/24").to_string(), "10.2.0.0/24");
        assert_eq!(p("2001:db8::/64").to_string(), "2001:db8::/64");
        assert_eq!(p("0.0.0.0/0").prefix_len(), 0);
        assert_eq!(p("::/0").prefix_len(), 0);
        assert_eq!(p("10.2.0.7").to_string(), "10.2.0.7/32");
        assert_eq!(p("2001:db8::7").to_string(), "2001:db8::7/128");
        assert!(p("10.0.0.0/8").is_ipv4());
        assert!(p("fd00::/8").is_ipv6());
    }

    #[test]
    fn rejects_bad_prefixes_with_reasons() {
        let e = "10.2.0.0/33".parse::<IpPrefix>().unwrap_err().to_string();
        assert_eq!(
            e,
            "\"10.2.0.0/33\" is not an IP prefix (prefix length must be 0..=32 for IPv4)"
        );
        let e = "2001:db8::/129"
            .parse::<IpPrefix>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("0..=128 for IPv6"), "{e}");
        let e = "10.2.0.1/24".parse::<IpPrefix>().unwrap_err().to_string();
        assert!(e.contains("did you mean \"10.2.0.0/24\""), "{e}");
        for bad in [
            "",
            "/24",
            "10.2.0/24",
            "10.2.0.0/",
            "10.2.0.0/+8",
            "10.2.0.0/x",
            "cell0",
        ] {
            assert!(bad.parse::<IpPrefix>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn ipv4_contains() {
        let net = p("10.2.0.0/24");
        assert!(net.contains(ip("10.2.0.0")));
        assert!(net.contains(ip("10.2.0.255")));
        assert!(!net.contains(ip("10.2.1.0")));
        assert!(!net.contains(ip("2001:db8::1")));
        // A dual-stack socket reports IPv4 peers as IPv4-mapped IPv6 addresses.
        assert!(net.contains(ip("::ffff:10.2.0.9")));
        assert!(!net.contains(ip("::ffff:10.3.0.9")));
        assert!(p("0.0.0.0/0").contains(ip("192.0.2.1")));
        assert!(p("10.2.0.7").contains(ip("10.2.0.7")));
        assert!(!p("10.2.0.7").contains(ip("10.2.0.8")));
    }

    #[test]
    fn ipv6_contains() {
        let net = p("2001:db8:0:1::/64");
        assert!(net.contains(ip("2001:db8:0:1::1")));
        assert!(net.contains(ip("2001:db8:0:1:ffff:ffff:ffff:ffff")));
        assert!(!net.contains(ip("2001:db8:0:2::1")));
        assert!(!net.contains(ip("10.2.0.1")));
        assert!(p("::/0").contains(ip("fe80::1")));
        assert!(p("2001:db8::/32").contains(ip("2001:db8:ffff::1")));
        assert!(p("::ffff:0:0/96").contains(ip("10.2.0.1")));
    }

    #[test]
    fn new_masks_host_bits() {
        let n = IpPrefix::new(ip("10.2.3.4"), 16).unwrap();
        assert_eq!(n.addr(), ip("10.2.0.0"));
        assert_eq!(IpPrefix::new(ip("2001:db8::1"), 129), None);
        assert_eq!(
            IpPrefix::new(ip("10.0.0.1"), 0).unwrap().to_string(),
            "0.0.0.0/0"
        );
    }
}
