//! `itcp-config`: the TOML configuration shared by `msrd` (and `itcpctl`) and `mh-lib`,
//! typed, with defaults, and validated at load with errors that name the file, the key
//! and what is wrong.
//!
//! # Schemas
//!
//! **msrd** ([`MsrdConfig`], see `config/examples/msrd.toml`):
//! * `[msr]` — `id`, `gateway` (required: the cell gateway address(es) every MSR
//!   shares), `socks_port`, `control_socket`, `log_level`, `log_format`;
//! * `[access]` — `mh_prefixes` (required, non-empty: an MSR must not be an open
//!   relay), `max_connections`, `max_connections_per_mh`, `accept_rate`, `accept_burst`;
//! * `[relay]` — `splice`, `pipe_size`, `buffer_size`, `connect_timeout_ms`,
//!   `drain_timeout_ms`;
//! * `[wireless]`, `[fixed]` — [`TcpTuning`] of each side (congestion control, buffers,
//!   window clamp, `notsent_lowat`, `nodelay`, keepalive, user timeout); all optional;
//! * `[[cell]]` — `interface` plus any `[wireless]` key, overriding `[wireless]` for
//!   that interface ([`MsrdConfig::wireless_tuning_for`]);
//! * `[transparent]` — `enabled`, `ports`, `listen_port` (TPROXY interception);
//! * `[interception]` — `nft_table`, `fwmark`, `route_table`;
//! * `[beacon]` — `enabled`, `interval_ms`, `lifetime_ms`, `port`, `interfaces`;
//! * `[handoff]` — `listen` (turns handoff on), `lan_interface`, `greet_port`,
//!   timeouts, `hold_after_ms`, `setup_wait_ms`, `closed_window_s`, `detect_hold_ms`,
//!   `stale_window_ms`, `keep_channels`, `images_in_parts`, `linger_s`,
//!   `unacked`, `log_file`, and
//!   `[[handoff.peer]]` (`id`, `address`, `key` or `key_file`).
//!
//! **MH** ([`MhConfig`], see `config/examples/mh.toml`), all optional:
//! * `[mh]` — `gateway` (unset = discover), `token_file`, `connect_timeout_ms`;
//! * `[mobility]` — `beacon_port`, `policy` (`eager`|`lazy`), `hysteresis_ms`.
//!
//! # Errors
//!
//! Unknown keys are errors. A [`ConfigError`] displays as one line,
//! `FILE: line L, column C: KEY: MESSAGE` (position and key whenever known), e.g.
//!
//! ```text
//! msrd.toml: line 5, column 31: access.mh_prefixes[1]: "10.2.0.0/33" is not an IP prefix (prefix length must be 0..=32 for IPv4)
//! msrd.toml: line 5, column 1: unknown key "max_conections" in [access] (expected one of: mh_prefixes, max_connections, ...)
//! ```
//!
//! and its parts are available as [`ConfigError::origin`], [`ConfigError::key`],
//! [`ConfigError::position`], [`ConfigError::kind`] and [`ConfigError::message`].
//!
//! Addresses are family-agnostic throughout: IPv4 and IPv6 ([`IpPrefix`]).

#![warn(missing_docs)]

mod error;
#[doc(hidden)]
#[allow(missing_docs)]
pub mod fuzzing;
mod load;
mod mh;
mod msrd;
mod prefix;

pub use error::{ConfigError, ConfigErrorKind};
pub use mh::{parse_gateway, MhConfig, MhSection, MobilityPolicy, MobilitySection};
pub use msrd::{
    parse_mac, AccessSection, BeaconSection, CellSection, ChannelTls, Detect, HandoffSection,
    InterceptionSection, LogFormat, LogLevel, MetricsSection, MsrSection, MsrdConfig, PeerSection,
    RelaySection, Sizing, TcpTuning, TransparentSection, UnackedPolicy, DEFAULT_SOCKS_PORT,
};
pub use prefix::{IpPrefix, ParsePrefixError};

#[cfg(test)]
mod tests;
