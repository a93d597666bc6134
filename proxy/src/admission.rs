//! Who may open connections through this MSR, and how many: MH prefixes (the MSR must
//! never be an open relay), connection limits overall and per MH, and an accept-rate
//! token bucket. Pure logic; the daemon holds it behind a mutex.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use itcp_config::IpPrefix;

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NotAnMh,
    TooManyConnections,
    TooManyForMh,
    RateLimited,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NotAnMh => "source is outside the configured MH prefixes",
            Refusal::TooManyConnections => "max_connections reached",
            Refusal::TooManyForMh => "max_connections_per_mh reached",
            Refusal::RateLimited => "accept rate limit",
        }
    }
}

/// Tokens refill at `rate` per second up to `burst`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last_ns: u64,
}

impl TokenBucket {
    pub fn new(rate: f64, burst: f64, now_ns: u64) -> Self {
        Self {
            rate,
            burst,
            tokens: burst,
            last_ns: now_ns,
        }
    }

    pub fn take(&mut self, now_ns: u64) -> bool {
        let dt = now_ns.saturating_sub(self.last_ns) as f64 / 1e9;
        self.last_ns = now_ns.max(self.last_ns);
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Connections still being set up (request handshake, fixed-side connect), counted
/// overall, per source address and per station (link-layer source on the cell), so
/// that half-open connections cannot use up the fds, and one station holding many
/// addresses of the MH prefix cannot take every slot.
#[derive(Debug)]
pub struct Setups {
    max_total: usize,
    max_per_src: usize,
    max_per_station: usize,
    total: usize,
    per_src: HashMap<IpAddr, usize>,
    per_station: HashMap<[u8; 6], usize>,
}

impl Setups {
    pub fn new(max_total: usize, max_per_src: usize, max_per_station: usize) -> Self {
        Setups {
            max_total,
            max_per_src,
            max_per_station,
            total: 0,
            per_src: HashMap::new(),
            per_station: HashMap::new(),
        }
    }

    /// Counts one more setup from `ip`, sent by `station` (its MAC, when known), unless
    /// a limit is reached.
    pub fn begin(&mut self, ip: IpAddr, station: Option<[u8; 6]>) -> bool {
        let n = self.per_src.get(&ip).copied().unwrap_or(0);
        let m = station.map_or(0, |s| self.per_station.get(&s).copied().unwrap_or(0));
        if self.total >= self.max_total || n >= self.max_per_src || m >= self.max_per_station {
            return false;
        }
        self.total += 1;
        self.per_src.insert(ip, n + 1);
        if let Some(s) = station {
            self.per_station.insert(s, m + 1);
        }
        true
    }

    /// Ends a setup counted by [`Setups::begin`] with the same arguments.
    pub fn end(&mut self, ip: IpAddr, station: Option<[u8; 6]>) {
        if let Some(n) = self.per_src.get_mut(&ip) {
            *n -= 1;
            self.total -= 1;
            if *n == 0 {
                self.per_src.remove(&ip);
            }
            if let Some(s) = station {
                if let Some(m) = self.per_station.get_mut(&s) {
                    *m -= 1;
                    if *m == 0 {
                        self.per_station.remove(&s);
                    }
                }
            }
        }
    }

    pub fn total(&self) -> usize {
        self.total
    }
}

/// Admission state of the daemon.
#[derive(Debug)]
pub struct Admission {
    prefixes: Vec<IpPrefix>,
    max_total: usize,
    max_per_mh: usize,
    total: usize,
    per_mh: HashMap<IpAddr, usize>,
    bucket: TokenBucket,
}

impl Admission {
    pub fn new(
        prefixes: Vec<IpPrefix>,
        max_total: usize,
        max_per_mh: usize,
        rate: f64,
        burst: f64,
        now_ns: u64,
    ) -> Self {
        Self {
            prefixes,
            max_total,
            max_per_mh,
            total: 0,
            per_mh: HashMap::new(),
            bucket: TokenBucket::new(rate, burst, now_ns),
        }
    }

    /// Is `ip` one of our MHs?
    pub fn is_mh(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.prefixes.iter().any(|p| p.contains(ip))
    }

    /// Admits one new connection of MH `ip`, counting it until [`Admission::release`].
    pub fn admit(&mut self, ip: IpAddr, now_ns: u64) -> Result<(), Refusal> {
        let ip = canonical(ip);
        if !self.is_mh(ip) {
            return Err(Refusal::NotAnMh);
        }
        if self.total >= self.max_total {
            return Err(Refusal::TooManyConnections);
        }
        if self.per_mh.get(&ip).copied().unwrap_or(0) >= self.max_per_mh {
            return Err(Refusal::TooManyForMh);
        }
        if !self.bucket.take(now_ns) {
            return Err(Refusal::RateLimited);
        }
        self.total += 1;
        *self.per_mh.entry(ip).or_default() += 1;
        Ok(())
    }

    /// Counts a connection that moved here in a handoff: never refused (it exists
    /// already; refusing would lose it), but counted against later admissions.
    pub fn admit_moved(&mut self, ip: IpAddr) {
        let ip = canonical(ip);
        self.total += 1;
        *self.per_mh.entry(ip).or_default() += 1;
    }

    pub fn release(&mut self, ip: IpAddr) {
        let ip = canonical(ip);
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.per_mh.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_mh.remove(&ip);
            }
        }
    }

    pub fn active(&self) -> usize {
        self.total
    }
}

/// IPv4-mapped IPv6 addresses (from dual-stack sockets) count as their IPv4 address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// A connection counted by admission until dropped (it travels with the connection's
/// sockets, through freezes and rollbacks).
pub struct Admitted {
    admission: Arc<Mutex<Admission>>,
    ip: IpAddr,
}

impl Admitted {
    /// Counts `ip`'s connection, already admitted by `admission`, until dropped.
    pub fn new(admission: &Arc<Mutex<Admission>>, ip: IpAddr) -> Admitted {
        Admitted {
            admission: admission.clone(),
            ip,
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admission.lock().unwrap().release(self.ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setups_are_limited_per_source_and_overall() {
        let a: IpAddr = "10.2.0.100".parse().unwrap();
        let b: IpAddr = "10.2.0.101".parse().unwrap();
        let mut s = Setups::new(3, 2, 3);
        assert!(s.begin(a, None) && s.begin(a, None));
        assert!(!s.begin(a, None), "per source");
        assert!(s.begin(b, None));
        assert!(!s.begin(b, None), "overall");
        s.end(a, None);
        assert!(s.begin(b, None));
        for ip in [a, b, b] {
            s.end(ip, None);
        }
        assert_eq!(s.total(), 0);
        // An unknown source ends nothing.
        s.end(a, None);
        assert_eq!(s.total(), 0);
    }

    #[test]
    fn one_station_with_many_addresses_gets_its_share_only() {
        let (mac, other) = ([2, 0, 0, 0, 0, 0x64], [2, 0, 0, 0, 0, 0x65]);
        // 1024 overall, 256 per address and per station: five addresses of one
        // station hold 256, and the others still find slots.
        let mut s = Setups::new(1024, 256, 256);
        let held = (102..=106)
            .flat_map(|i| (0..300).map(move |_| IpAddr::from([10, 2, 0, i])))
            .filter(|&ip| s.begin(ip, Some(mac)))
            .count();
        assert_eq!(held, 256);
        let ip: IpAddr = "10.2.0.101".parse().unwrap();
        assert!(s.begin(ip, Some(other)));
        // Ending frees the station's share.
        s.end("10.2.0.102".parse().unwrap(), Some(mac));
        assert!(s.begin("10.2.0.106".parse().unwrap(), Some(mac)));
        assert!(!s.begin("10.2.0.107".parse().unwrap(), Some(mac)));
        // Without a known station only the other bounds apply.
        assert!(s.begin("10.2.0.107".parse().unwrap(), None));
        assert_eq!(s.total(), 258);
    }

    const S: u64 = 1_000_000_000;

    fn adm() -> Admission {
        Admission::new(vec!["10.2.0.0/24".parse().unwrap()], 3, 2, 10.0, 5.0, 0)
    }

    #[test]
    fn prefixes_guard_the_door() {
        let mut a = adm();
        assert_eq!(
            a.admit("10.3.0.1".parse().unwrap(), 0),
            Err(Refusal::NotAnMh)
        );
        assert!(a.admit("10.2.0.7".parse().unwrap(), 0).is_ok());
        assert!(a.is_mh("::ffff:10.2.0.9".parse().unwrap()));
    }

    #[test]
    fn limits_per_mh_and_total() {
        let mut a = adm();
        let (m1, m2): (IpAddr, IpAddr) = ("10.2.0.1".parse().unwrap(), "10.2.0.2".parse().unwrap());
        a.admit(m1, 0).unwrap();
        a.admit(m1, 0).unwrap();
        assert_eq!(a.admit(m1, 0), Err(Refusal::TooManyForMh));
        a.admit(m2, 0).unwrap();
        assert_eq!(a.admit(m2, 0), Err(Refusal::TooManyConnections));
        a.release(m1);
        assert!(a.admit(m2, 0).is_ok());
        assert_eq!(a.active(), 3);
    }

    #[test]
    fn token_bucket_limits_rate() {
        let mut b = TokenBucket::new(10.0, 5.0, 0);
        assert_eq!((0..10).filter(|_| b.take(0)).count(), 5);
        assert!(!b.take(S / 20)); // half a token after 50 ms
        assert!(b.take(S / 10));
        // Long idle refills only up to the burst.
        assert_eq!((0..10).filter(|_| b.take(100 * S)).count(), 5);
    }
}
