//! [`MhOptions`]: where the I-TCP gateway is, which session token to present, timeouts —
//! and gateway discovery.
//!
//! Every setting left unset in `MhOptions` falls back to the environment, then to a
//! default, each time it is used:
//!
//! | setting | explicit | environment | default |
//! |---|---|---|---|
//! | gateway | [`MhOptions::gateway`] | `ITCP_GATEWAY` (`addr:port`, `addr` → port 1080, `host[:port]`) | default route's gateway (`/proc/net/route`, else `/proc/net/ipv6_route`), port 1080 |
//! | token | [`MhOptions::token`], [`MhOptions::token_file`] | `ITCP_TOKEN` (32 hex), `ITCP_TOKEN_FILE` | file [`DEFAULT_TOKEN_FILE`] (see [`mod@crate::token`]) |
//! | gateway connect timeout | [`MhOptions::connect_timeout`] | – | 10 s |
//! | reply timeout | [`MhOptions::reply_timeout`] | – | none |

use std::ffi::OsString;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use crate::socks::Token;

/// Port of the gateway when none is given (the SOCKS port).
pub const DEFAULT_GATEWAY_PORT: u16 = 1080;
/// Environment variable naming the gateway: `addr:port`, `addr` (port 1080), or
/// `host[:port]`.
pub const ENV_GATEWAY: &str = "ITCP_GATEWAY";
/// Environment variable holding the session token as 32 hex digits.
pub const ENV_TOKEN: &str = "ITCP_TOKEN";
/// Environment variable naming the token file.
pub const ENV_TOKEN_FILE: &str = "ITCP_TOKEN_FILE";
/// Where the MH's session token lives unless configured otherwise.
pub const DEFAULT_TOKEN_FILE: &str = "/run/itcp-mh/token";
/// Default timeout for reaching the gateway (TCP connect plus method/token negotiation).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings for talking to the MSR. `MhOptions::default()` uses the environment and the
/// defaults for everything (see the [module docs](self)); the builder methods override
/// single settings.
///
/// ```
/// use std::time::Duration;
/// let opts = itcp_mh::MhOptions::new()
///     .gateway("10.2.0.1:1080".parse().unwrap())
///     .connect_timeout(Duration::from_secs(3));
/// assert_eq!(opts.resolve_gateway().unwrap().port(), 1080);
/// ```
#[derive(Clone, Debug)]
pub struct MhOptions {
    gateway: Option<SocketAddr>,
    token: Option<Token>,
    token_file: Option<PathBuf>,
    connect_timeout: Duration,
    reply_timeout: Option<Duration>,
}

impl Default for MhOptions {
    fn default() -> Self {
        MhOptions {
            gateway: None,
            token: None,
            token_file: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            reply_timeout: None,
        }
    }
}

impl MhOptions {
    /// Same as `MhOptions::default()`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Use this gateway (the MSRs' shared address and SOCKS port) instead of
    /// `ITCP_GATEWAY` / the default route.
    pub fn gateway(mut self, addr: SocketAddr) -> Self {
        self.gateway = Some(addr);
        self
    }

    /// Present this session token instead of the one from `ITCP_TOKEN` / the token file.
    pub fn token(mut self, token: Token) -> Self {
        self.token = Some(token);
        self
    }

    /// Read (or create) the session token in this file instead of `ITCP_TOKEN` /
    /// `ITCP_TOKEN_FILE` / [`DEFAULT_TOKEN_FILE`].
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// Timeout for the TCP connect to the gateway and for the method/token negotiation
    /// (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Timeout for the MSR's reply to CONNECT and LISTEN (default: none — the MSR
    /// answers "timed out" itself when the fixed-side connect times out). Never applies
    /// to ACCEPT, whose reply only comes when a peer connects.
    pub fn reply_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.reply_timeout = timeout;
        self
    }

    /// Options from an MH config file (`[mh]` section; see `config/examples/mh.toml`):
    /// its gateway (if set), token file and connect timeout.
    pub fn from_config(cfg: &itcp_config::MhConfig) -> Self {
        let mut o = MhOptions::new()
            .token_file(cfg.mh.token_file.clone())
            .connect_timeout(cfg.mh.connect_timeout());
        if let Some(gw) = cfg.mh.gateway {
            o = o.gateway(gw);
        }
        o
    }

    /// Loads an MH config file; errors name the file and the key.
    pub fn load(path: impl AsRef<std::path::Path>) -> io::Result<Self> {
        itcp_config::MhConfig::load(path)
            .map(|c| MhOptions::from_config(&c))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
    }

    /// `ITCP_MH_CONFIG` names a config file: options from it; otherwise the defaults
    /// (environment and default route), as [`MhOptions::new`].
    pub fn from_env() -> io::Result<Self> {
        match std::env::var_os("ITCP_MH_CONFIG") {
            Some(p) if !p.is_empty() => MhOptions::load(p),
            _ => Ok(MhOptions::new()),
        }
    }

    /// The configured gateway connect timeout.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The configured reply timeout.
    pub fn get_reply_timeout(&self) -> Option<Duration> {
        self.reply_timeout
    }

    /// The gateway to use: the explicit one, else `ITCP_GATEWAY`, else the default
    /// route's gateway at port 1080.
    ///
    /// Errors: `InvalidInput` if `ITCP_GATEWAY` cannot be parsed/resolved, `NotFound`
    /// ("no I-TCP gateway: set ITCP_GATEWAY or configure a default route") if nothing
    /// gives an address.
    pub fn resolve_gateway(&self) -> io::Result<SocketAddr> {
        if let Some(gw) = self.gateway {
            return Ok(gw);
        }
        gateway_from_env_or_route(std::env::var(ENV_GATEWAY).ok())
    }

    /// The session token to present: the explicit one, else the explicit token file,
    /// else `ITCP_TOKEN`, else the file `ITCP_TOKEN_FILE` or [`DEFAULT_TOKEN_FILE`]
    /// (created if absent; a per-process token if it cannot be written — see
    /// [`mod@crate::token`]).
    pub fn resolve_token(&self) -> io::Result<Token> {
        if let Some(t) = self.token {
            return Ok(t);
        }
        if let Some(path) = &self.token_file {
            return crate::token::token_from_file_or_process(path);
        }
        token_from_env(
            std::env::var(ENV_TOKEN).ok(),
            std::env::var_os(ENV_TOKEN_FILE),
        )
    }
}

/// Gateway resolution after the explicit setting: `env` is the value of `ITCP_GATEWAY`.
fn gateway_from_env_or_route(env: Option<String>) -> io::Result<SocketAddr> {
    if let Some(value) = env.filter(|v| !v.trim().is_empty()) {
        return parse_gateway(&value)
            .map_err(|e| io::Error::new(e.kind(), format!("{ENV_GATEWAY}={value:?}: {e}")));
    }
    default_route_gateway().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "no I-TCP gateway: set ITCP_GATEWAY or configure a default route",
        )
    })
}

/// Token resolution after the explicit settings, given the values of `ITCP_TOKEN` and
/// `ITCP_TOKEN_FILE`.
fn token_from_env(env_token: Option<String>, env_file: Option<OsString>) -> io::Result<Token> {
    if let Some(hex) = env_token {
        return Token::from_hex(&hex).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{ENV_TOKEN} must be 32 hex digits"),
            )
        });
    }
    let path = env_file
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_TOKEN_FILE));
    crate::token::token_from_file_or_process(&path)
}

/// Parses a gateway given as `addr:port`, `[v6]:port`, a bare address (port 1080), or
/// `host[:port]` (resolved now; first address wins).
pub fn parse_gateway(s: &str) -> io::Result<SocketAddr> {
    let s = s.trim();
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok(sa);
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, DEFAULT_GATEWAY_PORT));
    }
    if let Ok(ip) = s
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<Ipv6Addr>()
    {
        return Ok(SocketAddr::new(IpAddr::V6(ip), DEFAULT_GATEWAY_PORT));
    }
    let bad = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid I-TCP gateway {s:?}: {why}"),
        )
    };
    if s.is_empty() {
        return Err(bad("empty".into()));
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((host, port)) => (
            host,
            port.parse::<u16>()
                .map_err(|_| bad(format!("port {port:?} is not a number 0-65535")))?,
        ),
        None => (s, DEFAULT_GATEWAY_PORT),
    };
    (host, port)
        .to_socket_addrs()
        .map_err(|e| bad(format!("cannot resolve {host:?}: {e}")))?
        .next()
        .ok_or_else(|| bad(format!("{host:?} resolves to no address")))
}

/// The default route's gateway at port 1080: IPv4 from `/proc/net/route`, else IPv6
/// from `/proc/net/ipv6_route`. `None` if there is no default route via a gateway.
pub fn default_route_gateway() -> Option<SocketAddr> {
    if let Ok(text) = std::fs::read_to_string("/proc/net/route") {
        if let Some(ip) = parse_proc_net_route(&text) {
            return Some(SocketAddr::new(IpAddr::V4(ip), DEFAULT_GATEWAY_PORT));
        }
    }
    if let Ok(text) = std::fs::read_to_string("/proc/net/ipv6_route") {
        if let Some((ip, iface)) = parse_proc_net_ipv6_route(&text) {
            let scope = if is_link_local(&ip) {
                interface_index(&iface).unwrap_or(0)
            } else {
                0
            };
            return Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                DEFAULT_GATEWAY_PORT,
                0,
                scope,
            )));
        }
    }
    None
}

const RTF_UP: u32 = 0x0001;
const RTF_GATEWAY: u32 = 0x0002;

/// The gateway of the lowest-metric default route (destination and mask 0, flags UP and
/// GATEWAY) in the text of `/proc/net/route`.
pub fn parse_proc_net_route(text: &str) -> Option<Ipv4Addr> {
    let mut best: Option<(u32, Ipv4Addr)> = None;
    for line in text.lines().skip(1) {
        // Iface Destination Gateway Flags RefCnt Use Metric Mask MTU Window IRTT
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        let (Some(dest), Some(gw), Some(flags), Some(mask)) =
            (hex(f[1]), hex(f[2]), hex(f[3]), hex(f[7]))
        else {
            continue;
        };
        let metric: u32 = f[6].parse().unwrap_or(u32::MAX);
        if dest != 0
            || mask != 0
            || gw == 0
            || flags & (RTF_UP | RTF_GATEWAY) != RTF_UP | RTF_GATEWAY
        {
            continue;
        }
        // The kernel prints the network-order address as a host-order %08X.
        let ip = Ipv4Addr::from(gw.to_ne_bytes());
        if best.is_none_or(|(m, _)| metric < m) {
            best = Some((metric, ip));
        }
    }
    best.map(|(_, ip)| ip)
}

/// The next hop and interface of the lowest-metric IPv6 default route (`::/0` via a
/// gateway) in the text of `/proc/net/ipv6_route`.
pub fn parse_proc_net_ipv6_route(text: &str) -> Option<(Ipv6Addr, String)> {
    let mut best: Option<(u32, Ipv6Addr, String)> = None;
    for line in text.lines() {
        // dest plen src plen nexthop metric refcnt use flags iface
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            continue;
        }
        let (Some(dest), Some(plen), Some(nexthop), Some(metric), Some(flags)) = (
            parse_hex_v6(f[0]),
            u8::from_str_radix(f[1], 16).ok(),
            parse_hex_v6(f[4]),
            u32::from_str_radix(f[5], 16).ok(),
            u32::from_str_radix(f[8], 16).ok(),
        ) else {
            continue;
        };
        if !dest.is_unspecified()
            || plen != 0
            || nexthop.is_unspecified()
            || flags & (RTF_UP | RTF_GATEWAY) != RTF_UP | RTF_GATEWAY
        {
            continue;
        }
        if best.as_ref().is_none_or(|(m, _, _)| metric < *m) {
            best = Some((metric, nexthop, f[9].to_owned()));
        }
    }
    best.map(|(_, ip, iface)| (ip, iface))
}

fn parse_hex_v6(s: &str) -> Option<Ipv6Addr> {
    if s.len() != 32 {
        return None;
    }
    u128::from_str_radix(s, 16).ok().map(Ipv6Addr::from)
}

fn is_link_local(ip: &Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

fn interface_index(name: &str) -> Option<u32> {
    nix::net::if_::if_nametoindex(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_strings() {
        let p = |s: &str| parse_gateway(s).unwrap();
        assert_eq!(p("10.2.0.1:1080"), "10.2.0.1:1080".parse().unwrap());
        assert_eq!(p("10.2.0.1:9050"), "10.2.0.1:9050".parse().unwrap());
        assert_eq!(p("10.2.0.1"), "10.2.0.1:1080".parse().unwrap());
        assert_eq!(p(" 10.2.0.1\n"), "10.2.0.1:1080".parse().unwrap());
        assert_eq!(p("fd00::1"), "[fd00::1]:1080".parse().unwrap());
        assert_eq!(p("[fd00::1]"), "[fd00::1]:1080".parse().unwrap());
        assert_eq!(p("[fd00::1]:1081"), "[fd00::1]:1081".parse().unwrap());
        assert_eq!(p("localhost:1234").port(), 1234);
        assert!(p("localhost").ip().is_loopback());
        let e = parse_gateway("10.2.0.1:99999").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("99999"), "{e}");
        assert!(parse_gateway("").is_err());
    }

    #[test]
    fn explicit_gateway_wins() {
        let gw: SocketAddr = "192.0.2.7:1234".parse().unwrap();
        assert_eq!(MhOptions::new().gateway(gw).resolve_gateway().unwrap(), gw);
    }

    #[test]
    fn proc_net_route() {
        let text = "\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
wlan0\t00000000\t0100020A\t0003\t0\t0\t600\t00000000\t0\t0\t0
eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0
eth0\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0
";
        // Lowest metric wins. (The file holds host-order words: these vectors are what a
        // little-endian kernel prints.)
        if cfg!(target_endian = "little") {
            assert_eq!(
                parse_proc_net_route(text),
                Some(Ipv4Addr::new(192, 168, 1, 1))
            );
            let only_wlan = "Iface\tDestination\tGateway\n\
wlan0\t00000000\t0100020A\t0003\t0\t0\t600\t00000000\t0\t0\t0\n";
            assert_eq!(
                parse_proc_net_route(only_wlan),
                Some(Ipv4Addr::new(10, 2, 0, 1))
            );
        }
        assert_eq!(
            parse_proc_net_route(
                "Iface\tDestination\tGateway\neth0\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
            ),
            None
        );
        assert_eq!(parse_proc_net_route(""), None);
    }

    #[test]
    fn proc_net_ipv6_route() {
        let text = "\
fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     wlan0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000100 00000001 00000000 00000003     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
";
        let (ip, iface) = parse_proc_net_ipv6_route(text).unwrap();
        assert_eq!(ip, "fd00::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(iface, "eth0");
        assert!(is_link_local(&"fe80::1".parse().unwrap()));
        assert!(!is_link_local(&"fd00::1".parse().unwrap()));
        assert_eq!(parse_proc_net_ipv6_route(""), None);
    }

    #[test]
    fn gateway_from_env_value() {
        let gw = gateway_from_env_or_route(Some("10.2.0.1".into())).unwrap();
        assert_eq!(gw, "10.2.0.1:1080".parse().unwrap());
        let gw = gateway_from_env_or_route(Some("[fd00::2]:1081".into())).unwrap();
        assert_eq!(gw, "[fd00::2]:1081".parse().unwrap());
        let e = gateway_from_env_or_route(Some("10.2.0.1:http".into())).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(
            e.to_string()
                .starts_with("ITCP_GATEWAY=\"10.2.0.1:http\": "),
            "{e}"
        );
        // Unset/empty falls through to the default route, or the "no gateway" error.
        match gateway_from_env_or_route(Some("  ".into())) {
            Ok(gw) => assert_eq!(gw.port(), DEFAULT_GATEWAY_PORT),
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::NotFound);
                assert_eq!(
                    e.to_string(),
                    "no I-TCP gateway: set ITCP_GATEWAY or configure a default route"
                );
            }
        }
    }

    #[test]
    fn token_from_env_values() {
        let t = token_from_env(Some("000102030405060708090a0b0c0d0e0f".into()), None).unwrap();
        assert_eq!(t.0[15], 0x0f);
        let e = token_from_env(Some("xyz".into()), None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let dir = std::env::temp_dir().join(format!("itcp-mh-envtok-{}", std::process::id()));
        let file = dir.join("tok");
        let t1 = token_from_env(None, Some(file.clone().into())).unwrap();
        assert_eq!(crate::token::load_or_create_token_file(&file).unwrap(), t1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn explicit_token_wins() {
        let t = Token([7; 16]);
        assert_eq!(MhOptions::new().token(t).resolve_token().unwrap(), t);
    }
}
