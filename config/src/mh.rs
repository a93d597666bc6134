//! The mobile host schema (used by `mh-lib`): [`MhConfig`] and its sections.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::error::ConfigError;
use crate::load::{de_helpers, read, Source};
use crate::msrd::DEFAULT_SOCKS_PORT;

/// The whole MH configuration. Every key is optional: `MhConfig::default()` is valid.
/// Build it with [`MhConfig::load`] or [`MhConfig::from_str`], which also validate it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MhConfig {
    /// `[mh]`: how to reach the MSR gateway.
    #[serde(default)]
    pub mh: MhSection,
    /// `[mobility]`: the mobility agent.
    #[serde(default)]
    pub mobility: MobilitySection,
}

/// `[mh]`: the MSR gateway and the MH session token.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MhSection {
    /// MSR gateway socket address; `None` = discover (the default route's gateway, port
    /// 1080). In the file, `"10.2.0.1:1080"`, `"[2001:db8::1]:1080"`, or a bare address
    /// for port 1080.
    #[serde(default, deserialize_with = "de_gateway")]
    pub gateway: Option<SocketAddr>,
    /// Where the MH session token is kept (`/run/itcp-mh/token`).
    #[serde(default = "default_token_file")]
    pub token_file: PathBuf,
    /// Timeout of a connect through the MSR, in milliseconds (10000).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
}

impl Default for MhSection {
    fn default() -> Self {
        MhSection {
            gateway: None,
            token_file: default_token_file(),
            connect_timeout_ms: default_connect_timeout_ms(),
        }
    }
}

impl MhSection {
    /// `connect_timeout_ms` as a `Duration`.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}

fn default_token_file() -> PathBuf {
    PathBuf::from("/run/itcp-mh/token")
}
fn default_connect_timeout_ms() -> u64 {
    10_000
}

/// `[mobility]`: beacons and the cell-switching policy.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MobilitySection {
    /// UDP port MSR beacons arrive on (4345).
    #[serde(default = "default_beacon_port", deserialize_with = "de_helpers::port")]
    pub beacon_port: u16,
    /// When to switch cells (`eager`).
    #[serde(default)]
    pub policy: MobilityPolicy,
    /// Minimum time between cell switches, in milliseconds (2000).
    #[serde(default = "default_hysteresis_ms")]
    pub hysteresis_ms: u64,
}

impl Default for MobilitySection {
    fn default() -> Self {
        MobilitySection {
            beacon_port: default_beacon_port(),
            policy: MobilityPolicy::default(),
            hysteresis_ms: default_hysteresis_ms(),
        }
    }
}

impl MobilitySection {
    /// `hysteresis_ms` as a `Duration`.
    pub fn hysteresis(&self) -> Duration {
        Duration::from_millis(self.hysteresis_ms)
    }
}

fn default_beacon_port() -> u16 {
    4345
}
fn default_hysteresis_ms() -> u64 {
    2000
}

/// Cell switching policy (seed 003: eager vs lazy movement detection).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MobilityPolicy {
    /// Switch as soon as a new MSR's beacon is heard (default).
    #[default]
    Eager,
    /// Stay until the current MSR's beacons stop.
    Lazy,
}

impl MobilityPolicy {
    /// The config spelling (`"eager"`).
    pub fn as_str(self) -> &'static str {
        match self {
            MobilityPolicy::Eager => "eager",
            MobilityPolicy::Lazy => "lazy",
        }
    }
}

impl fmt::Display for MobilityPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses an MSR gateway: `ip:port`, `[ipv6]:port`, or a bare IP (port 1080).
pub fn parse_gateway(s: &str) -> Result<SocketAddr, String> {
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok(sa);
    }
    if let Ok(ip) = s
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        return Ok(SocketAddr::new(ip, DEFAULT_SOCKS_PORT));
    }
    Err(format!(
        "{s:?} is not a gateway address (expected e.g. \"10.2.0.1:1080\", \"[2001:db8::1]:1080\", or a bare address for port 1080)"
    ))
}

fn de_gateway<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = Option<SocketAddr>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a gateway address string like \"10.2.0.1:1080\"")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            parse_gateway(v).map(Some).map_err(E::custom)
        }
    }
    d.deserialize_str(V)
}

impl MhConfig {
    /// Reads and validates the config file at `path`; errors name the file as given.
    pub fn load(path: impl AsRef<Path>) -> Result<MhConfig, ConfigError> {
        let (origin, text) = read(path.as_ref())?;
        MhConfig::from_str(&text, &origin)
    }

    /// Parses and validates config text; `origin` names it in errors (a file name).
    pub fn from_str(text: &str, origin: &str) -> Result<MhConfig, ConfigError> {
        let (config, source) = Source::parse::<MhConfig>(origin, text)?;
        config.validate(&source)?;
        Ok(config)
    }

    fn validate(&self, src: &Source<'_>) -> Result<(), ConfigError> {
        if let Some(g) = self.mh.gateway {
            if g.ip().is_unspecified() || g.ip().is_multicast() {
                return Err(src.invalid(
                    "mh.gateway",
                    format!("{} cannot be an MSR gateway address", g.ip()),
                ));
            }
            if g.port() == 0 {
                return Err(src.invalid(
                    "mh.gateway",
                    "port 0 is not a valid TCP port (expected 1..=65535)",
                ));
            }
        }
        if self.mh.token_file.as_os_str().is_empty() {
            return Err(src.invalid("mh.token_file", "must not be empty"));
        }
        if self.mh.connect_timeout_ms == 0 {
            return Err(src.invalid(
                "mh.connect_timeout_ms",
                "0 is too small (must be at least 1)",
            ));
        }
        Ok(())
    }
}
