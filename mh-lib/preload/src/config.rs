//! What the shim intercepts: destination ports and prefixes for `connect`, local ports
//! for `listen`, read once from the environment.
//!
//! | variable | meaning | example |
//! |---|---|---|
//! | `ITCP_PRELOAD_PORTS` | destination ports (and ranges) whose connects go through I-TCP | `80,443,8000-8100` |
//! | `ITCP_PRELOAD_PREFIXES` | destination prefixes whose connects go through I-TCP | `10.0.0.0/24,fd00::/64,192.0.2.7` |
//! | `ITCP_PRELOAD_LISTEN_PORTS` | local ports whose listening sockets listen at the MSR too | `8080,6000-6010` |
//! | `ITCP_PRELOAD_DEBUG` | `1`: print each decision on stderr | `1` |
//!
//! A connect is intercepted when at least one of the first two is set and the
//! destination matches every one that is set (port in the list *and* address in a
//! prefix). Connections to the gateway itself are never intercepted. Everything else
//! (gateway, token, timeouts) comes from `MhOptions::from_env()`.

use std::net::{IpAddr, SocketAddr};

/// Port ranges (inclusive).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ports(pub Vec<(u16, u16)>);

impl Ports {
    pub fn parse(s: &str) -> Result<Ports, String> {
        let mut v = Vec::new();
        for item in s
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
        {
            let port = |p: &str| {
                p.trim()
                    .parse::<u16>()
                    .map_err(|_| format!("port {p:?} is not a number 0-65535"))
            };
            let r = match item.split_once('-') {
                Some((a, b)) => (port(a)?, port(b)?),
                None => (port(item)?, port(item)?),
            };
            if r.0 > r.1 {
                return Err(format!("port range {item:?} is empty"));
            }
            v.push(r);
        }
        Ok(Ports(v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, p: u16) -> bool {
        self.0.iter().any(|&(a, b)| a <= p && p <= b)
    }
}

/// Address prefixes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prefixes(pub Vec<(IpAddr, u8)>);

impl Prefixes {
    pub fn parse(s: &str) -> Result<Prefixes, String> {
        let mut v = Vec::new();
        for item in s
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
        {
            let (a, len) = match item.split_once('/') {
                Some((a, l)) => (a, Some(l)),
                None => (item, None),
            };
            let ip: IpAddr = a
                .parse()
                .map_err(|_| format!("prefix {item:?}: {a:?} is not an address"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let len = match len {
                Some(l) => l
                    .parse::<u8>()
                    .ok()
                    .filter(|&l| l <= max)
                    .ok_or_else(|| format!("prefix {item:?}: length must be 0-{max}"))?,
                None => max,
            };
            v.push((ip, len));
        }
        Ok(Prefixes(v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|&(net, len)| match (net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - len as u32).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - len as u32).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        })
    }
}

/// The shim's settings.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub ports: Ports,
    pub prefixes: Prefixes,
    pub listen_ports: Ports,
    pub debug: bool,
}

impl Config {
    /// From the environment; a malformed variable is reported (on stderr by the caller)
    /// and disables interception, rather than silently routing around I-TCP.
    pub fn from_env() -> Result<Config, String> {
        let var = |n: &str| std::env::var(n).unwrap_or_default();
        let named = |n: &str, e: String| format!("{n}: {e}");
        Ok(Config {
            ports: Ports::parse(&var("ITCP_PRELOAD_PORTS"))
                .map_err(|e| named("ITCP_PRELOAD_PORTS", e))?,
            prefixes: Prefixes::parse(&var("ITCP_PRELOAD_PREFIXES"))
                .map_err(|e| named("ITCP_PRELOAD_PREFIXES", e))?,
            listen_ports: Ports::parse(&var("ITCP_PRELOAD_LISTEN_PORTS"))
                .map_err(|e| named("ITCP_PRELOAD_LISTEN_PORTS", e))?,
            debug: matches!(var("ITCP_PRELOAD_DEBUG").as_str(), "1" | "true" | "yes"),
        })
    }

    /// Whether a connect to `dest` goes through I-TCP.
    pub fn intercepts(&self, dest: SocketAddr) -> bool {
        (!self.ports.is_empty() || !self.prefixes.is_empty())
            && (self.ports.is_empty() || self.ports.contains(dest.port()))
            && (self.prefixes.is_empty() || self.prefixes.contains(dest.ip()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_prefixes() {
        let p = Ports::parse("80, 8000-8100").unwrap();
        assert!(p.contains(80) && p.contains(8000) && p.contains(8100));
        assert!(!p.contains(81) && !p.contains(8101));
        assert!(Ports::parse("9-8").is_err());
        assert!(Ports::parse("http").is_err());
        let x = Prefixes::parse("10.0.0.0/24 fd00::/64,192.0.2.7").unwrap();
        assert!(x.contains("10.0.0.200".parse().unwrap()));
        assert!(!x.contains("10.0.1.1".parse().unwrap()));
        assert!(x.contains("fd00::5".parse().unwrap()));
        assert!(x.contains("192.0.2.7".parse().unwrap()));
        assert!(!x.contains("192.0.2.8".parse().unwrap()));
        assert!(Prefixes::parse("0.0.0.0/0")
            .unwrap()
            .contains("1.2.3.4".parse().unwrap()));
        assert!(Prefixes::parse("10.0.0.0/33").is_err());
    }

    #[test]
    fn interception_needs_every_set_condition() {
        let mut c = Config::default();
        let d: SocketAddr = "10.0.0.1:80".parse().unwrap();
        assert!(!c.intercepts(d), "nothing configured: nothing intercepted");
        c.ports = Ports::parse("80").unwrap();
        assert!(c.intercepts(d));
        c.prefixes = Prefixes::parse("10.9.0.0/16").unwrap();
        assert!(!c.intercepts(d));
        c.ports = Ports::default();
        c.prefixes = Prefixes::parse("10.0.0.0/8").unwrap();
        assert!(c.intercepts(d));
    }
}
