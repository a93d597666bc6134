//! The `msrd` schema: [`MsrdConfig`] and its sections.

use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::error::{ConfigError, ConfigErrorKind};
use crate::load::{de_helpers, read, Source};
use crate::prefix::IpPrefix;

/// Default SOCKS port of the MSR gateway (`msr.socks_port`), also what an MH assumes
/// when it discovers the gateway without a port.
pub const DEFAULT_SOCKS_PORT: u16 = 1080;

/// The whole `msrd` configuration. Build it with [`MsrdConfig::load`] or
/// [`MsrdConfig::from_str`], which also validate it; the bare `Deserialize` impl only
/// checks the shape.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MsrdConfig {
    /// `[msr]`: identity, gateway address, control socket, logging.
    #[serde(default)]
    pub msr: MsrSection,
    /// `[access]`: who may use this MSR, and how much.
    #[serde(default)]
    pub access: AccessSection,
    /// `[relay]`: the relay engine.
    #[serde(default)]
    pub relay: RelaySection,
    /// `[wireless]`: TCP tuning of the wireless side (MH ⇄ MSR).
    #[serde(default)]
    pub wireless: TcpTuning,
    /// `[fixed]`: TCP tuning of the fixed side (MSR ⇄ FH).
    #[serde(default)]
    pub fixed: TcpTuning,
    /// `[[cell]]`: per-interface overrides of `[wireless]`.
    #[serde(default, rename = "cell")]
    pub cells: Vec<CellSection>,
    /// `[transparent]`: interception of unmodified MH apps.
    #[serde(default)]
    pub transparent: TransparentSection,
    /// `[interception]`: msrd's nftables table, fwmark and routing table.
    #[serde(default)]
    pub interception: InterceptionSection,
    /// `[beacon]`: the MSR's advertisements on its cells.
    #[serde(default)]
    pub beacon: BeaconSection,
    /// `[handoff]`: moving MHs' connections between MSRs.
    #[serde(default)]
    pub handoff: HandoffSection,
    /// `[metrics]`: Prometheus metrics and the status page over HTTP.
    #[serde(default)]
    pub metrics: MetricsSection,
}

/// `[metrics]`: an HTTP listener serving Prometheus text on `/metrics` and a status
/// page on `/`. Off unless `listen` is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// Address and port to serve on, e.g. `"10.1.0.11:9473"` (unset: no listener).
    /// Only this address answers: use a management or fixed-LAN address, not the cell
    /// gateway address the MHs reach.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// Host names the listener answers to besides IP literals and `localhost` (the
    /// `Host:` of a request; port optional), e.g. `["msr1.mgmt.example.net"]`. A request
    /// naming anything else gets 403, so a page whose DNS name is rebound to the MSR
    /// cannot read it from a browser (empty: addresses and localhost only).
    #[serde(default)]
    pub hosts: Vec<String>,
}

/// `[handoff]`: the MSR⇄MSR channel, the MH greeting port, timeouts and the handoff
/// log. Handoff is on when `listen` is set.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandoffSection {
    /// Address of the authenticated MSR⇄MSR channel on the fixed LAN, e.g.
    /// `"10.1.0.11:4347"` (unset: no handoff).
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// Fixed-LAN interface where this MSR answers ARP for the MHs it serves (proxy ARP)
    /// and announces takeovers (gratuitous ARP). Unset: routing is left to the operator.
    #[serde(default)]
    pub lan_interface: Option<String>,
    /// UDP port of MH greetings on the cell gateway address (4346).
    #[serde(default = "default_greet_port", deserialize_with = "de_helpers::port")]
    pub greet_port: u16,
    /// New MSR: how long to wait for the images after asking the old MSR (3000 ms).
    #[serde(default = "default_handoff_timeout")]
    pub images_timeout_ms: u64,
    /// Old MSR: how long to wait for the new MSR's acknowledgement before calling the
    /// handoff off (3000 ms). The connections stay frozen until the new MSR answers
    /// the call-off (what it restarted before it heard moves all the same), up to 30 s.
    #[serde(default = "default_handoff_timeout")]
    pub ack_timeout_ms: u64,
    /// Old MSR: how long after a handoff stray TCP of the MH is still dropped silently
    /// here (never forwarded to the MH, never answered), in ms (3000).
    #[serde(default = "default_hold_after")]
    pub hold_after_ms: u64,
    /// Old MSR: how long a handoff waits for the MH's fixed-side connects in flight to
    /// finish, so they move as relays, in ms (1000; below `images_timeout_ms`).
    /// Connects still in flight after it stay here (logged).
    #[serde(default = "default_setup_wait")]
    pub setup_wait_ms: u64,
    /// New MSR: for this long after a handoff, segments of the MH's connections that
    /// were closed at the old MSR (their TIME_WAIT and closing states stay there) are
    /// dropped silently here instead of answered with RST, in seconds (60; 0: off).
    /// The same window keeps stray segments of relays that ended gracefully here from
    /// drawing RSTs.
    #[serde(default = "default_closed_window")]
    pub closed_window_s: u64,
    /// New MSR, cells with `detect = "network"`: how long an arriving MH's packets are
    /// dropped (never answered) while the MSR finds out where its connections are, in
    /// ms (500). Each arrival is one such bounded hold.
    #[serde(default = "default_detect_hold")]
    pub detect_hold_ms: u64,
    /// Old MSR, cells with `detect = "network"`: for this long after the MH's
    /// connections left for another MSR, a frame of the MH that reaches this cell counts
    /// as its return only if it proves it left the MH after the move (a TCP segment
    /// acknowledging data the other MSR sent); others may have waited in the cell's
    /// uplink queue since before the move. In ms (500; 0: every frame counts at once).
    #[serde(default = "default_stale_window")]
    pub stale_window_ms: u64,
    /// Keep one authenticated channel open to each `[[handoff.peer]]` ahead of need, so
    /// a handoff does not wait for TCP's and TLS's handshakes (true). Each is replaced
    /// after a minute, and a peer closes one left idle for 90 s.
    #[serde(default = "default_true")]
    pub keep_channels: bool,
    /// Old MSR: send the images of an MH's many connections (512 or more) in parts
    /// as they are captured, so that the new MSR restores them meanwhile (true), to a
    /// new MSR that takes parts. False: in one message after the last capture.
    #[serde(default = "default_true")]
    pub images_in_parts: bool,
    /// An MH that is gone for this long without coming back has its connections
    /// closed (the fixed side with FIN), in seconds (120; 0: never).
    #[serde(default = "default_linger")]
    pub linger_s: u64,
    /// How restored sockets put back bytes in flight: `auto`, `as_new`, `as_sent`.
    #[serde(default)]
    pub unacked: UnackedPolicy,
    /// New MSR: once a moved connection runs, tell the MH's TCP that what it sent into
    /// the move was lost to the move (RFC 6069 ICMP unreachables, one per doubling of
    /// its retransmission timeout), so an upload resumes at once instead of at its next
    /// backed-off timeout (true). An MH that is not retransmitting ignores them.
    #[serde(default = "default_true")]
    pub revert_backoff: bool,
    /// The handoff log, one JSON record per line
    /// (`/var/log/itcp/handoffs.jsonl`).
    #[serde(default = "default_handoff_log")]
    pub log_file: PathBuf,
    /// `[[handoff.peer]]`: the MSRs this one hands off with.
    #[serde(default, rename = "peer")]
    pub peers: Vec<PeerSection>,
    /// `[handoff.tls]`: mutual TLS 1.3 on the channel with certificates from the
    /// operator's CA, instead of a key per pair of MSRs.
    #[serde(default)]
    pub tls: Option<ChannelTls>,
}

/// `[handoff.tls]`: the MSR⇄MSR channel runs over mutual TLS 1.3. Every MSR holds a
/// certificate from the operator's CA that names its `msr.id` (a DNS subjectAltName),
/// so any two MSRs of one operator can hand off with no key per pair.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelTls {
    /// The operator's CA certificate(s), PEM: peers' certificates must chain to one.
    pub ca: PathBuf,
    /// This MSR's certificate, PEM (intermediates may follow it), naming `msr.id`.
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8, SEC1 or PKCS#1), readable by msrd only.
    pub key: PathBuf,
    /// Accept channels from any MSR with a certificate of the CA, not only from the
    /// `[[handoff.peer]]` list (true: one operator's MSRs hand off with each other).
    #[serde(default = "default_true")]
    pub accept_unlisted: bool,
}

impl Default for HandoffSection {
    fn default() -> Self {
        HandoffSection {
            listen: None,
            lan_interface: None,
            greet_port: default_greet_port(),
            images_timeout_ms: default_handoff_timeout(),
            ack_timeout_ms: default_handoff_timeout(),
            hold_after_ms: default_hold_after(),
            setup_wait_ms: default_setup_wait(),
            closed_window_s: default_closed_window(),
            detect_hold_ms: default_detect_hold(),
            stale_window_ms: default_stale_window(),
            keep_channels: true,
            images_in_parts: true,
            linger_s: default_linger(),
            unacked: UnackedPolicy::default(),
            revert_backoff: true,
            log_file: default_handoff_log(),
            peers: Vec::new(),
            tls: None,
        }
    }
}

impl HandoffSection {
    /// True when this MSR takes part in handoffs.
    pub fn enabled(&self) -> bool {
        self.listen.is_some()
    }

    /// The peer named `id`.
    pub fn peer(&self, id: &str) -> Option<&PeerSection> {
        self.peers.iter().find(|p| p.id == id)
    }
}

/// How bytes that were sent but not acknowledged are put back in a restored socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnackedPolicy {
    /// Re-sent at once when they fit the restored socket's first flight, else as sent.
    #[default]
    Auto,
    /// Always re-sent as new data.
    AsNew,
    /// Always restored as sent (recovered by probe or retransmission timeout).
    AsSent,
}

/// `[[handoff.peer]]`: one MSR to hand off with, and the key shared with it (no key
/// with `[handoff.tls]`: certificates authenticate).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerSection {
    /// The peer's `msr.id`.
    pub id: String,
    /// Its `[handoff] listen` address.
    pub address: SocketAddr,
    /// The key shared with this peer, hex (at least 16 bytes). Prefer `key_file`.
    #[serde(default)]
    pub key: Option<String>,
    /// A file holding the key as hex (mode 0600).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

impl PeerSection {
    /// The key bytes (read from `key_file` if set).
    pub fn key_bytes(&self) -> Result<Vec<u8>, String> {
        let text = match (&self.key, &self.key_file) {
            (Some(k), _) => k.clone(),
            (None, Some(f)) => std::fs::read_to_string(f).map_err(|e| {
                format!(
                    "peer {}: cannot read key_file {}: {e}",
                    self.id,
                    f.display()
                )
            })?,
            (None, None) => return Err(format!("peer {} has no key", self.id)),
        };
        parse_key(text.trim()).map_err(|e| format!("peer {}: {e}", self.id))
    }
}

/// With `[handoff.tls]` an MSR id is the DNS name its certificate carries.
fn check_dns_id(src: &Source<'_>, path: &str, id: &str) -> Result<(), ConfigError> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if id.len() > 253
        || !id.split('.').all(label_ok)
        || id.bytes().all(|b| b.is_ascii_digit() || b == b'.')
    {
        return Err(src.invalid(
            path,
            format!(
                "{id:?} cannot be named in a certificate: with [handoff.tls] MSR ids are DNS names \
                 (letters, digits, '-' and '.', e.g. \"msr1\" or \"msr1.example.net\")"
            ),
        ));
    }
    Ok(())
}

fn parse_key(s: &str) -> Result<Vec<u8>, String> {
    if s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("the key must be hex digits (an even number of them)".into());
    }
    let v: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect();
    if v.len() < 16 {
        return Err(format!(
            "the key has {} bytes; at least 16 are needed",
            v.len()
        ));
    }
    Ok(v)
}

fn default_greet_port() -> u16 {
    4346
}
fn default_handoff_timeout() -> u64 {
    3000
}
fn default_setup_wait() -> u64 {
    1000
}
fn default_closed_window() -> u64 {
    60
}
fn default_detect_hold() -> u64 {
    500
}
fn default_stale_window() -> u64 {
    500
}
fn default_hold_after() -> u64 {
    3000
}
fn default_linger() -> u64 {
    120
}
fn default_handoff_log() -> PathBuf {
    PathBuf::from("/var/log/itcp/handoffs.jsonl")
}

/// `[beacon]`: advertisements every MSR broadcasts on its cells, from which MHs learn
/// which MSR serves them (and move when they hear a new one).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BeaconSection {
    /// Send beacons (true).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Interval between beacons in ms (1000, as in the paper).
    #[serde(default = "default_beacon_interval")]
    pub interval_ms: u64,
    /// How long one beacon stays valid at the MH, in ms (3000); ≥ interval_ms.
    #[serde(default = "default_beacon_lifetime")]
    pub lifetime_ms: u64,
    /// UDP port beacons are broadcast to (4345).
    #[serde(default = "default_beacon_port", deserialize_with = "de_helpers::port")]
    pub port: u16,
    /// Cell interfaces to advertise on (default: every `[[cell]]` interface).
    #[serde(default)]
    pub interfaces: Vec<String>,
    /// Send beacons at wall-clock instants ≡ offset_ms (mod interval_ms), so that
    /// neighbouring MSRs (NTP-synchronised) can be given distinct, known phases. Unset:
    /// the first beacon goes out at start.
    #[serde(default)]
    pub offset_ms: Option<u64>,
}

impl Default for BeaconSection {
    fn default() -> Self {
        BeaconSection {
            enabled: true,
            interval_ms: default_beacon_interval(),
            lifetime_ms: default_beacon_lifetime(),
            port: default_beacon_port(),
            interfaces: Vec::new(),
            offset_ms: None,
        }
    }
}

fn default_beacon_interval() -> u64 {
    1000
}
fn default_beacon_lifetime() -> u64 {
    3000
}
fn default_beacon_port() -> u16 {
    4345
}

/// `[msr]`: who this MSR is and where it listens.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MsrSection {
    /// Name in logs and handoff records (default: the hostname).
    #[serde(default = "default_id")]
    pub id: String,
    /// The cell gateway address(es) every MSR shares; SOCKS listens here (required).
    #[serde(default, deserialize_with = "de_helpers::ip_addrs")]
    pub gateway: Vec<IpAddr>,
    /// The MAC address every MSR's cell interfaces take, e.g. `"02:00:5e:00:01:01"`
    /// (unset: the interfaces keep their own). The same on every MSR, as a VRRP virtual
    /// MAC: an MH's neighbour entry for the gateway stays right when it moves, so hosts
    /// that run nothing of ours keep their gateway. Restored at exit.
    #[serde(default)]
    pub gateway_mac: Option<String>,
    /// SOCKS5 port on the gateway address (1080).
    #[serde(default = "default_socks_port", deserialize_with = "de_helpers::port")]
    pub socks_port: u16,
    /// Unix socket for `itcpctl` (`/run/msrd/control.sock`).
    #[serde(default = "default_control_socket")]
    pub control_socket: PathBuf,
    /// Log verbosity (`info`).
    #[serde(default)]
    pub log_level: LogLevel,
    /// Log line format (`text`).
    #[serde(default)]
    pub log_format: LogFormat,
}

impl Default for MsrSection {
    fn default() -> Self {
        MsrSection {
            id: default_id(),
            gateway: Vec::new(),
            gateway_mac: None,
            socks_port: DEFAULT_SOCKS_PORT,
            control_socket: default_control_socket(),
            log_level: LogLevel::default(),
            log_format: LogFormat::default(),
        }
    }
}

impl MsrSection {
    /// `gateway_mac` as bytes (validated at load).
    pub fn gateway_mac(&self) -> Option<[u8; 6]> {
        self.gateway_mac.as_deref().and_then(|m| parse_mac(m).ok())
    }

    /// The SOCKS listen addresses: every gateway address at `socks_port`.
    pub fn socks_addrs(&self) -> Vec<SocketAddr> {
        self.gateway
            .iter()
            .map(|&ip| SocketAddr::new(ip, self.socks_port))
            .collect()
    }
}

fn default_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "msr".to_owned())
}

fn default_socks_port() -> u16 {
    DEFAULT_SOCKS_PORT
}

fn default_control_socket() -> PathBuf {
    PathBuf::from("/run/msrd/control.sock")
}

/// Log verbosity, from least to most verbose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Errors and warnings.
    Warn,
    /// Normal operation (default).
    #[default]
    Info,
    /// Per-connection detail.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// The config spelling (`"info"`), also what `tracing` filters accept.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// The config spelling (`"text"` or `"json"`).
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[access]`: which MHs may use this MSR and the admission limits.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessSection {
    /// Only MHs with an address in one of these prefixes may use this MSR (required,
    /// non-empty: an MSR must not be an open relay).
    #[serde(default)]
    pub mh_prefixes: Vec<IpPrefix>,
    /// Relayed connections overall (100000).
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// Relayed connections per MH address (4096).
    #[serde(default = "default_max_connections_per_mh")]
    pub max_connections_per_mh: u32,
    /// New connections per second, token bucket rate (5000).
    #[serde(default = "default_accept_rate")]
    pub accept_rate: u32,
    /// Token bucket depth (10000).
    #[serde(default = "default_accept_burst")]
    pub accept_burst: u32,
    /// Connections still being set up (request handshake, fixed-side connect) at once,
    /// overall (1024). Beyond it new connections are closed at accept: half-open
    /// connections cannot exhaust msrd's file descriptors.
    #[serde(default = "default_max_handshakes")]
    pub max_handshakes: u32,
    /// The same per MH address (256).
    #[serde(default = "default_max_handshakes_per_mh")]
    pub max_handshakes_per_mh: u32,
    /// The same per station, all its addresses together: a station is a link-layer
    /// address on a cell, as the MSR's neighbour table has it (unset: the value of
    /// `max_handshakes_per_mh`). Bounds what one station holding many addresses of the
    /// MH prefixes can take of `max_handshakes`.
    #[serde(default)]
    pub max_handshakes_per_station: Option<u32>,
    /// MH addresses one station may have bound here by network detection at once (8).
    /// Past it the station's oldest address with no connection here is let go, so a
    /// station sending from many addresses of the prefixes holds a few at a time.
    #[serde(default = "default_max_addresses_per_station")]
    pub max_addresses_per_station: u32,
}

impl Default for AccessSection {
    fn default() -> Self {
        AccessSection {
            mh_prefixes: Vec::new(),
            max_connections: default_max_connections(),
            max_connections_per_mh: default_max_connections_per_mh(),
            accept_rate: default_accept_rate(),
            accept_burst: default_accept_burst(),
            max_handshakes: default_max_handshakes(),
            max_handshakes_per_mh: default_max_handshakes_per_mh(),
            max_handshakes_per_station: None,
            max_addresses_per_station: default_max_addresses_per_station(),
        }
    }
}

impl AccessSection {
    /// Whether `mh` is in one of the configured MH prefixes.
    pub fn allows(&self, mh: IpAddr) -> bool {
        self.mh_prefixes.iter().any(|p| p.contains(mh))
    }

    /// Connections in setup at once per station: `max_handshakes_per_station`, or
    /// `max_handshakes_per_mh` when unset.
    pub fn handshakes_per_station(&self) -> u32 {
        self.max_handshakes_per_station
            .unwrap_or(self.max_handshakes_per_mh)
    }
}

fn default_max_connections() -> u32 {
    100_000
}
fn default_max_connections_per_mh() -> u32 {
    4096
}
fn default_accept_rate() -> u32 {
    5000
}
fn default_accept_burst() -> u32 {
    10_000
}
fn default_max_handshakes() -> u32 {
    1024
}
fn default_max_addresses_per_station() -> u32 {
    8
}
fn default_max_handshakes_per_mh() -> u32 {
    256
}

/// `[relay]`: how bytes are moved between the two halves.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySection {
    /// Zero-copy `splice(2)` relay (true); false copies through user space.
    #[serde(default = "default_true")]
    pub splice: bool,
    /// Bytes per splice pipe, 4096..=67108864 (1048576): the most one read takes; the
    /// relay reads again only once the pipe is written out.
    #[serde(default = "default_pipe_size")]
    pub pipe_size: usize,
    /// User-space copy buffer when splice is off, 1024..=67108864 (65536).
    #[serde(default = "default_buffer_size")]
    pub buffer_size: usize,
    /// Fixed-side connect timeout in milliseconds (10000).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// On SIGTERM, how long connections may finish, in milliseconds (30000).
    #[serde(default = "default_drain_timeout_ms")]
    pub drain_timeout_ms: u64,
    /// Resolve domain names in SOCKS requests (ATYP 03) with the router's resolver
    /// (true); false answers them with "address type not supported" (08).
    #[serde(default = "default_true")]
    pub resolve_names: bool,
    /// How long a name may take to resolve, in milliseconds (3000); then the request
    /// gets "host unreachable" (04).
    #[serde(default = "default_resolve_timeout_ms")]
    pub resolve_timeout_ms: u64,
}

impl Default for RelaySection {
    fn default() -> Self {
        RelaySection {
            splice: true,
            pipe_size: default_pipe_size(),
            buffer_size: default_buffer_size(),
            connect_timeout_ms: default_connect_timeout_ms(),
            drain_timeout_ms: default_drain_timeout_ms(),
            resolve_names: true,
            resolve_timeout_ms: default_resolve_timeout_ms(),
        }
    }
}

impl RelaySection {
    /// `connect_timeout_ms` as a `Duration`.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// `resolve_timeout_ms` as a `Duration`.
    pub fn resolve_timeout(&self) -> Duration {
        Duration::from_millis(self.resolve_timeout_ms)
    }

    /// `drain_timeout_ms` as a `Duration`.
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }
}

fn default_true() -> bool {
    true
}
fn default_pipe_size() -> usize {
    1 << 20
}
fn default_buffer_size() -> usize {
    64 << 10
}
fn default_connect_timeout_ms() -> u64 {
    10_000
}
fn default_drain_timeout_ms() -> u64 {
    30_000
}
fn default_resolve_timeout_ms() -> u64 {
    3000
}

/// TCP tuning of one side of the relay (`[wireless]`, `[fixed]`, or a `[[cell]]`).
/// Every field is optional. Unset on the fixed side means "leave the kernel default";
/// on the wireless side, what `sizing` says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpTuning {
    /// TCP_CONGESTION algorithm name (`cubic`, `bbr`, `reno`, ...).
    pub congestion_control: Option<String>,
    /// SO_SNDBUF in bytes (0 = autotune).
    pub send_buffer: Option<u32>,
    /// SO_RCVBUF in bytes (0 = autotune).
    pub recv_buffer: Option<u32>,
    /// TCP_WINDOW_CLAMP in bytes (0 = none).
    pub window_clamp: Option<u32>,
    /// TCP_NOTSENT_LOWAT in bytes.
    pub notsent_lowat: Option<u32>,
    /// TCP_NODELAY (msrd's relay sockets: on unless set false).
    pub nodelay: Option<bool>,
    /// SO_KEEPALIVE + TCP_KEEPIDLE in seconds (unset = no keepalive).
    pub keepalive_idle_s: Option<u32>,
    /// TCP_KEEPINTVL in seconds (needs `keepalive_idle_s`).
    pub keepalive_interval_s: Option<u32>,
    /// TCP_KEEPCNT (needs `keepalive_idle_s`).
    pub keepalive_count: Option<u32>,
    /// TCP_USER_TIMEOUT in milliseconds.
    pub user_timeout_ms: Option<u32>,
    /// Wireless side only: who sizes what the keys above leave unset (`cell`).
    pub sizing: Option<Sizing>,
}

/// Who sizes the wireless side's keys that the configuration leaves unset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sizing {
    /// msrd, for the cell: its choice of congestion control, a small unsent queue on
    /// each wireless socket, and the fixed side's receive buffer following how fast
    /// the wireless side drains, so that bytes wait at the FH rather than at the MSR.
    #[default]
    Cell,
    /// The kernel's defaults, as a plain proxy has them.
    Kernel,
}

impl TcpTuning {
    /// Every key set in `self` wins; the rest come from `base`.
    pub fn merged_over(&self, base: &TcpTuning) -> TcpTuning {
        TcpTuning {
            sizing: self.sizing.or(base.sizing),
            congestion_control: self
                .congestion_control
                .clone()
                .or_else(|| base.congestion_control.clone()),
            send_buffer: self.send_buffer.or(base.send_buffer),
            recv_buffer: self.recv_buffer.or(base.recv_buffer),
            window_clamp: self.window_clamp.or(base.window_clamp),
            notsent_lowat: self.notsent_lowat.or(base.notsent_lowat),
            nodelay: self.nodelay.or(base.nodelay),
            keepalive_idle_s: self.keepalive_idle_s.or(base.keepalive_idle_s),
            keepalive_interval_s: self.keepalive_interval_s.or(base.keepalive_interval_s),
            keepalive_count: self.keepalive_count.or(base.keepalive_count),
            user_timeout_ms: self.user_timeout_ms.or(base.user_timeout_ms),
        }
    }

    /// True when no key is set.
    pub fn is_empty(&self) -> bool {
        *self == TcpTuning::default()
    }
}

/// `[[cell]]`: overrides of `[wireless]` for connections arriving on one interface.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "RawCell")]
pub struct CellSection {
    /// The cell's network interface name (required).
    pub interface: String,
    /// How this MSR learns that an MH arrived in the cell (`agent`).
    pub detect: Detect,
    /// The control socket of the hostapd serving the cell, whose station association
    /// events start network detection at once (`detect = "network"` only).
    pub hostapd: Option<std::path::PathBuf>,
    /// The `[wireless]` keys this cell overrides.
    pub tuning: TcpTuning,
}

/// How an MSR learns that an MH arrived in one of its cells.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Detect {
    /// The MH's agent greets the MSR (mh-lib): the greeting proves the MH's token.
    #[default]
    Agent,
    /// From the network: the first IP packet of an MH not served here. Trusts the
    /// cell's link layer to authenticate stations (an MH is its MAC and IP address as
    /// first seen); for MHs that run nothing of ours. Needs `msr.gateway_mac`.
    Network,
}

/// The on-disk shape of a `[[cell]]`: `interface` plus the [`TcpTuning`] keys written
/// out, because serde's `flatten` cannot be combined with `deny_unknown_fields`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCell {
    interface: String,
    #[serde(default)]
    detect: Detect,
    hostapd: Option<std::path::PathBuf>,
    congestion_control: Option<String>,
    send_buffer: Option<u32>,
    recv_buffer: Option<u32>,
    window_clamp: Option<u32>,
    notsent_lowat: Option<u32>,
    nodelay: Option<bool>,
    keepalive_idle_s: Option<u32>,
    keepalive_interval_s: Option<u32>,
    keepalive_count: Option<u32>,
    user_timeout_ms: Option<u32>,
    sizing: Option<Sizing>,
}

impl From<RawCell> for CellSection {
    fn from(c: RawCell) -> CellSection {
        CellSection {
            interface: c.interface,
            detect: c.detect,
            hostapd: c.hostapd,
            tuning: TcpTuning {
                sizing: c.sizing,
                congestion_control: c.congestion_control,
                send_buffer: c.send_buffer,
                recv_buffer: c.recv_buffer,
                window_clamp: c.window_clamp,
                notsent_lowat: c.notsent_lowat,
                nodelay: c.nodelay,
                keepalive_idle_s: c.keepalive_idle_s,
                keepalive_interval_s: c.keepalive_interval_s,
                keepalive_count: c.keepalive_count,
                user_timeout_ms: c.user_timeout_ms,
            },
        }
    }
}

/// `[transparent]`: interception of unmodified MH apps with nftables TPROXY.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransparentSection {
    /// Intercept MH connections (false).
    #[serde(default)]
    pub enabled: bool,
    /// TCP destination ports to intercept (required, non-empty, when enabled).
    #[serde(default, deserialize_with = "de_helpers::ports")]
    pub ports: Vec<u16>,
    /// Local TPROXY listener port (1081).
    #[serde(default = "default_listen_port", deserialize_with = "de_helpers::port")]
    pub listen_port: u16,
}

impl Default for TransparentSection {
    fn default() -> Self {
        TransparentSection {
            enabled: false,
            ports: Vec::new(),
            listen_port: default_listen_port(),
        }
    }
}

fn default_listen_port() -> u16 {
    1081
}

/// `[interception]`: the kernel objects msrd owns for transparent sockets.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterceptionSection {
    /// msrd's own nftables table, `inet` family (`itcp_msrd`).
    #[serde(default = "default_nft_table")]
    pub nft_table: String,
    /// Packet mark for transparent sockets, non-zero (0x4954).
    #[serde(default = "default_fwmark")]
    pub fwmark: u32,
    /// Policy routing table for marked packets (4954); not 253, 254 or 255.
    #[serde(default = "default_route_table")]
    pub route_table: u32,
    /// NFLOG group on which msrd's rules report MHs arriving in cells with network
    /// detection (4954); with handoff on, the SYN-ACKs sent to MHs are reported on the
    /// next group (4955). Another program must not use either.
    #[serde(default = "default_nflog_group")]
    pub nflog_group: u16,
    /// Netfilter queue (NFQUEUE) in which msrd holds an MH's TCP packets while its
    /// connections are frozen for a handoff (4954); another program must not use it.
    /// Held packets are delivered once the connection runs again, here or at the MSR
    /// it moved to, so neither host waits for a retransmission timeout.
    #[serde(default = "default_hold_queue")]
    pub hold_queue: u16,
}

impl Default for InterceptionSection {
    fn default() -> Self {
        InterceptionSection {
            nft_table: default_nft_table(),
            fwmark: default_fwmark(),
            route_table: default_route_table(),
            nflog_group: default_nflog_group(),
            hold_queue: default_hold_queue(),
        }
    }
}

fn default_nft_table() -> String {
    "itcp_msrd".to_owned()
}
fn default_fwmark() -> u32 {
    0x4954
}
fn default_route_table() -> u32 {
    4954
}
fn default_nflog_group() -> u16 {
    4954
}
fn default_hold_queue() -> u16 {
    4954
}

impl MsrdConfig {
    /// Reads and validates the config file at `path`; errors name the file as given.
    pub fn load(path: impl AsRef<Path>) -> Result<MsrdConfig, ConfigError> {
        let (origin, text) = read(path.as_ref())?;
        MsrdConfig::from_str(&text, &origin)
    }

    /// Parses and validates config text; `origin` names it in errors (a file name).
    pub fn from_str(text: &str, origin: &str) -> Result<MsrdConfig, ConfigError> {
        let (config, source) = Source::parse::<MsrdConfig>(origin, text)?;
        config.validate(&source)?;
        Ok(config)
    }

    /// The wireless-side tuning for a connection that arrived on `interface`: that
    /// cell's `[[cell]]` keys over `[wireless]` (just `[wireless]` for other or unknown
    /// interfaces).
    pub fn wireless_tuning_for(&self, interface: Option<&str>) -> TcpTuning {
        match interface.and_then(|i| self.cell(i)) {
            Some(cell) => cell.tuning.merged_over(&self.wireless),
            None => self.wireless.clone(),
        }
    }

    /// The `[[cell]]` for `interface`, if configured.
    pub fn cell(&self, interface: &str) -> Option<&CellSection> {
        self.cells.iter().find(|c| c.interface == interface)
    }

    fn validate(&self, src: &Source<'_>) -> Result<(), ConfigError> {
        self.validate_msr(src)?;
        self.validate_access(src)?;
        self.validate_relay(src)?;
        validate_tuning(
            src,
            "wireless",
            &self.wireless,
            self.wireless.keepalive_idle_s,
        )?;
        validate_tuning(src, "fixed", &self.fixed, self.fixed.keepalive_idle_s)?;
        if self.fixed.sizing.is_some() {
            return Err(src.invalid(
                "fixed.sizing",
                "sizing belongs to [wireless] (or a [[cell]]): it sizes the fixed side from \
                 the wireless side's rate; set [fixed] keys to fix them instead",
            ));
        }
        let mut seen = HashSet::new();
        for (i, cell) in self.cells.iter().enumerate() {
            let path = format!("cell[{i}]");
            check_ifname(src, &format!("{path}.interface"), &cell.interface)?;
            if !seen.insert(cell.interface.as_str()) {
                return Err(src.invalid(
                    &format!("{path}.interface"),
                    format!(
                        "interface {:?} already has a [[cell]] above",
                        cell.interface
                    ),
                ));
            }
            let idle = cell
                .tuning
                .keepalive_idle_s
                .or(self.wireless.keepalive_idle_s);
            validate_tuning(src, &path, &cell.tuning, idle)?;
            if cell.hostapd.is_some() && cell.detect != Detect::Network {
                return Err(src.invalid(
                    &format!("{path}.hostapd"),
                    "needs detect = \"network\": hostapd's association events start \
                     network detection",
                ));
            }
            if cell.detect == Detect::Network {
                if self.msr.gateway_mac.is_none() {
                    return Err(src.invalid(
                        &format!("{path}.detect"),
                        "\"network\" needs msr.gateway_mac: an MH that runs nothing of ours \
                         keeps its gateway only if every MSR answers with the same MAC",
                    ));
                }
                if !self.handoff.enabled() {
                    return Err(src.invalid(
                        &format!("{path}.detect"),
                        "\"network\" needs handoff (set handoff.listen): it pulls the \
                         arriving MH's connections from its previous MSR",
                    ));
                }
            }
        }
        self.validate_transparent(src)?;
        self.validate_interception(src)?;
        self.validate_beacon(src)?;
        self.validate_handoff(src)?;
        self.validate_metrics(src)
    }

    fn validate_metrics(&self, src: &Source<'_>) -> Result<(), ConfigError> {
        for h in &self.metrics.hosts {
            let n = h.strip_suffix('.').unwrap_or(h);
            let label_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            };
            if n.is_empty() || n.len() > 253 || !n.split('.').all(label_ok) {
                return Err(src.invalid(
                    "metrics.hosts",
                    format!("{h:?} is not a DNS name (letters, digits, '-' and '.'; no port)"),
                ));
            }
        }
        let Some(l) = self.metrics.listen else {
            return Ok(());
        };
        if l.port() == 0 {
            return Err(src.invalid(
                "metrics.listen",
                format!("{l}: port 0 is not a port to scrape; pick one (e.g. 9473)"),
            ));
        }
        if l.ip().is_multicast() {
            return Err(src.invalid(
                "metrics.listen",
                format!("{} is a multicast address", l.ip()),
            ));
        }
        let clash = |other: SocketAddr| {
            other.port() == l.port()
                && (other.ip() == l.ip() || other.ip().is_unspecified() || l.ip().is_unspecified())
        };
        if let Some(a) = self.msr.socks_addrs().into_iter().find(|&a| clash(a)) {
            return Err(src.invalid(
                "metrics.listen",
                format!("{l} is also the SOCKS listener {a} ([msr] gateway, socks_port)"),
            ));
        }
        if let Some(h) = self.handoff.listen.filter(|&h| clash(h)) {
            return Err(src.invalid(
                "metrics.listen",
                format!("{l} is also the handoff channel {h} ([handoff] listen)"),
            ));
        }
        Ok(())
    }

    fn validate_handoff(&self, src: &Source<'_>) -> Result<(), ConfigError> {
        let h = &self.handoff;
        if let Some(i) = &h.lan_interface {
            check_ifname(src, "handoff.lan_interface", i)?;
        }
        in_range(
            src,
            "handoff.images_timeout_ms",
            h.images_timeout_ms,
            10,
            600_000,
        )?;
        in_range(src, "handoff.ack_timeout_ms", h.ack_timeout_ms, 10, 600_000)?;
        in_range(src, "handoff.hold_after_ms", h.hold_after_ms, 0, 600_000)?;
        in_range(src, "handoff.linger_s", h.linger_s, 0, 2_000_000)?;
        in_range(src, "handoff.closed_window_s", h.closed_window_s, 0, 3600)?;
        in_range(src, "handoff.detect_hold_ms", h.detect_hold_ms, 50, 10_000)?;
        in_range(src, "handoff.stale_window_ms", h.stale_window_ms, 0, 10_000)?;
        if h.setup_wait_ms >= h.images_timeout_ms {
            return Err(src.invalid(
                "handoff.setup_wait_ms",
                format!(
                    "{} ms must be below handoff.images_timeout_ms ({} ms): the new MSR \
                     would give up on the images while this one still waits",
                    h.setup_wait_ms, h.images_timeout_ms
                ),
            ));
        }
        if h.log_file.as_os_str().is_empty() {
            return Err(src.invalid("handoff.log_file", "must not be empty"));
        }
        let mut seen = HashSet::new();
        for (i, p) in h.peers.iter().enumerate() {
            let path = format!("handoff.peer[{i}]");
            if p.id.is_empty() || p.id.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(src.invalid(
                    &format!("{path}.id"),
                    format!("{:?} is not an MSR name", p.id),
                ));
            }
            if p.id == self.msr.id {
                return Err(src.invalid(
                    &format!("{path}.id"),
                    format!("{:?} is this MSR's own id", p.id),
                ));
            }
            if !seen.insert(p.id.as_str()) {
                return Err(src.invalid(
                    &format!("{path}.id"),
                    format!("peer {:?} is listed twice", p.id),
                ));
            }
            if h.tls.is_some() {
                check_dns_id(src, &format!("{path}.id"), &p.id)?;
                if p.key.is_some() || p.key_file.is_some() {
                    return Err(src.invalid(
                        &format!("{path}.key"),
                        "with [handoff.tls] certificates authenticate the channel: remove key and key_file",
                    ));
                }
                continue;
            }
            match (&p.key, &p.key_file) {
                (Some(_), Some(_)) => {
                    return Err(src.invalid(&format!("{path}.key"), "set key or key_file, not both"))
                }
                (None, None) => {
                    return Err(src.error(
                        ConfigErrorKind::MissingKey,
                        &format!("{path}.key"),
                        "missing: every peer needs key (hex) or key_file",
                    ))
                }
                (Some(k), None) => {
                    parse_key(k).map_err(|e| src.invalid(&format!("{path}.key"), e))?;
                }
                (None, Some(_)) => {}
            }
        }
        if let Some(t) = &h.tls {
            check_dns_id(src, "msr.id", &self.msr.id)?;
            for (k, v) in [("ca", &t.ca), ("cert", &t.cert), ("key", &t.key)] {
                if v.as_os_str().is_empty() {
                    return Err(src.invalid(&format!("handoff.tls.{k}"), "must not be empty"));
                }
            }
        }
        if !h.peers.is_empty() && h.listen.is_none() {
            return Err(src.error(
                ConfigErrorKind::MissingKey,
                "handoff.listen",
                "missing: peers are listed but no address for the MSR⇄MSR channel (e.g. listen = \"10.1.0.11:4347\")",
            ));
        }
        Ok(())
    }

    fn validate_beacon(&self, src: &Source<'_>) -> Result<(), ConfigError> {
        let b = &self.beacon;
        in_range(src, "beacon.interval_ms", b.interval_ms, 10, 600_000)?;
        if b.lifetime_ms < b.interval_ms {
            return Err(src.invalid(
                "beacon.lifetime_ms",
                format!(
                    "{} is shorter than beacon.interval_ms ({}): advertisements would expire between beacons",
                    b.lifetime_ms, b.interval_ms
                ),
            ));
        }
        for (i, ifname) in b.interfaces.iter().enumerate() {
            check_ifname(src, &format!("beacon.interfaces[{i}]"), ifname)?;
        }
        if let Some(o) = b.offset_ms {
            in_range(
                src,
                "beacon.offset_ms",
                o,
                0,
                b.interval_ms.saturating_sub(1),
            )?;
        }
        Ok(())
    }

    /// The interfaces beacons go out on: `[beacon] interfaces`, else every `[[cell]]`.
    pub fn beacon_interfaces(&self) -> Vec<String> {
        if self.beacon.interfaces.is_empty() {
            self.cells.iter().map(|c| c.interface.clone()).collect()
        } else {
            self.beacon.interfaces.clone()
        }
    }

    fn validate_msr(&self, src: &Source<'_>) -> Result<(), ConfigError> {
        let m = &self.msr;
        if m.id.is_empty()
            || m.id.chars().count() > 64
            || m.id.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(src.invalid(
                "msr.id",
                format!(
                    "{:?} is not a usable MSR name (1..=64 characters, no spaces)",
                    m.id
                ),
            ));
        }
        if m.gateway.is_empty() {
            return Err(src.error(
                ConfigErrorKind::MissingKey,
                "msr.gateway",
                "missing or empty: list the cell gateway address(es) this MSR owns, e.g. gateway = [\"10.2.0.1\"]",
            ));
        }
        let mut seen = HashSet::new();
        for (i, g) in m.gateway.iter().enumerate() {
            let path = format!("msr.gateway[{i}]");
            if g.is_unspecified() || g.is_multicast() {
                return Err(src.invalid(&path, format!("{g} cannot be a gateway address (use the cell interface's own unicast address)")));
            }
            if !seen.insert(g) {
                return Err(src.invalid(&path, format!("{g} is listed twice")));
            }
        }
        if let Some(mac) = &m.gateway_mac {
            parse_mac(mac).map_err(|e| src.invalid("msr.gateway_mac", e))?;
        }
        if m.control_socket.as_os_str().is_empty() {
            return Err(src.invalid("msr.control_socket", "must not be empty"));
        }
        // sun_path holds 108 bytes including the terminating NUL.
        if m.control_socket.as_os_str().len() > 107 {
            return Err(src.invalid(
                "msr.control_socket",
                "path is too long for a Unix socket (at most 107 bytes)",
            ));
        }
        Ok(())
    }

    fn validate_access(&self, src: &Source<'_>) -> Result<(), ConfigError> {
        let a = &self.access;
        if a.mh_prefixes.is_empty() {
            return Err(src.error(
                ConfigErrorKind::MissingKey,
                "access.mh_prefixes",
                "missing or empty: list the prefixes of the MHs this MSR serves, e.g. mh_prefixes = [\"10.2.0.0/24\"] \
                 (without them the MSR would be an open relay)",
            ));
        }
        let mut seen = HashSet::new();
        for (i, p) in a.mh_prefixes.iter().enumerate() {
            let path = format!("access.mh_prefixes[{i}]");
            if p.prefix_len() == 0 {
                return Err(src.invalid(
                    &path,
                    format!("{p} matches every address and would make this MSR an open relay; list the cells' MH prefixes"),
                ));
            }
            if !seen.insert(p) {
                return Err(src.invalid(&path, format!("{p} is listed twice")));
            }
        }
        at_least(
            src,
            "access.max_connections",
            u64::from(a.max_connections),
            1,
        )?;
        at_least(
            src,
            "access.max_connections_per_mh",
            u64::from(a.max_connections_per_mh),
            1,
        )?;
        if a.max_connections_per_mh > a.max_connections {
            return Err(src.invalid(
                "access.max_connections_per_mh",
                format!(
                    "{} is more than access.max_connections ({})",
                    a.max_connections_per_mh, a.max_connections
                ),
            ));
        }
        at_least(src, "access.accept_rate", u64::from(a.accept_rate), 1)?;
        at_least(src, "access.accept_burst", u64::from(a.accept_burst), 1)?;
        at_least(src, "access.max_handshakes", u64::from(a.max_handshakes), 1)?;
        at_least(
            src,
            "access.max_handshakes_per_mh",
            u64::from(a.max_handshakes_per_mh),
            1,
        )?;
        if a.max_handshakes_per_mh > a.max_handshakes {
            return Err(src.invalid(
                "access.max_handshakes_per_mh",
                format!(
                    "{} is more than access.max_handshakes ({})",
                    a.max_handshakes_per_mh, a.max_handshakes
                ),
            ));
        }
        at_least(
            src,
            "access.max_addresses_per_station",
            u64::from(a.max_addresses_per_station),
            1,
        )?;
        if let Some(n) = a.max_handshakes_per_station {
            at_least(src, "access.max_handshakes_per_station", u64::from(n), 1)?;
            if n > a.max_handshakes {
                return Err(src.invalid(
                    "access.max_handshakes_per_station",
                    format!(
                        "{n} is more than access.max_handshakes ({})",
                        a.max_handshakes
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_relay(&self, src: &Source<'_>) -> Result<(), ConfigError> {
        let r = &self.relay;
        in_range(src, "relay.pipe_size", r.pipe_size as u64, 4096, 64 << 20)?;
        in_range(
            src,
            "relay.buffer_size",
            r.buffer_size as u64,
            1024,
            64 << 20,
        )?;
        at_least(src, "relay.connect_timeout_ms", r.connect_timeout_ms, 1)?;
        at_least(src, "relay.resolve_timeout_ms", r.resolve_timeout_ms, 1)
    }

    fn validate_transparent(&self, src: &Source<'_>) -> Result<(), ConfigError> {
        let t = &self.transparent;
        if t.enabled && t.ports.is_empty() {
            return Err(src.error(
                ConfigErrorKind::MissingKey,
                "transparent.ports",
                "missing or empty while transparent.enabled = true: list the TCP ports to intercept, e.g. ports = [80, 443]",
            ));
        }
        let mut seen = HashSet::new();
        for (i, p) in t.ports.iter().enumerate() {
            if !seen.insert(p) {
                return Err(src.invalid(
                    &format!("transparent.ports[{i}]"),
                    format!("port {p} is listed twice"),
                ));
            }
        }
        if t.enabled && t.listen_port == self.msr.socks_port {
            return Err(src.invalid(
                "transparent.listen_port",
                format!(
                    "{} is also msr.socks_port; the TPROXY listener needs its own port",
                    t.listen_port
                ),
            ));
        }
        Ok(())
    }

    fn validate_interception(&self, src: &Source<'_>) -> Result<(), ConfigError> {
        let i = &self.interception;
        if i.nft_table.is_empty()
            || i.nft_table.len() > 255
            || !i
                .nft_table
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(src.invalid(
                "interception.nft_table",
                format!(
                    "{:?} is not a usable nftables table name (1..=255 of A-Z a-z 0-9 _)",
                    i.nft_table
                ),
            ));
        }
        if i.fwmark == 0 {
            return Err(src.invalid("interception.fwmark", "must not be 0 (0 means \"no mark\")"));
        }
        if i.nflog_group == 0 || i.nflog_group == u16::MAX {
            return Err(src.invalid(
                "interception.nflog_group",
                "must be 1 to 65534 (group 0 is the kernel's default log group, and msrd \
                 also uses the group after this one)",
            ));
        }
        match i.route_table {
            0 => Err(src.invalid("interception.route_table", "must not be 0 (0 means \"unspecified\")")),
            253..=255 => Err(src.invalid(
                "interception.route_table",
                format!(
                    "{} is reserved by the kernel (253 default, 254 main, 255 local); pick another table",
                    i.route_table
                ),
            )),
            _ => Ok(()),
        }
    }
}

fn at_least(src: &Source<'_>, path: &str, v: u64, min: u64) -> Result<(), ConfigError> {
    if v < min {
        return Err(src.invalid(path, format!("{v} is too small (must be at least {min})")));
    }
    Ok(())
}

fn in_range(src: &Source<'_>, path: &str, v: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if !(min..=max).contains(&v) {
        return Err(src.invalid(path, format!("{v} is out of range (must be {min}..={max})")));
    }
    Ok(())
}

/// Checks one tuning block at `section`; `idle` is the keepalive idle time in effect for
/// it (a cell inherits `[wireless]`'s).
fn validate_tuning(
    src: &Source<'_>,
    section: &str,
    t: &TcpTuning,
    idle: Option<u32>,
) -> Result<(), ConfigError> {
    let key = |k: &str| format!("{section}.{k}");
    if let Some(cc) = &t.congestion_control {
        if cc.is_empty()
            || cc.len() > 15
            || !cc
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(src.invalid(
                &key("congestion_control"),
                format!(
                    "{cc:?} is not a congestion control name (1..=15 of a-z 0-9 _, e.g. \"cubic\")"
                ),
            ));
        }
    }
    // These are C ints in setsockopt.
    let int_max = i32::MAX as u64;
    for (k, v) in [
        ("send_buffer", t.send_buffer),
        ("recv_buffer", t.recv_buffer),
        ("window_clamp", t.window_clamp),
        ("notsent_lowat", t.notsent_lowat),
        ("user_timeout_ms", t.user_timeout_ms),
    ] {
        if let Some(v) = v {
            in_range(src, &key(k), u64::from(v), 0, int_max)?;
        }
    }
    // The kernel's MAX_TCP_KEEPIDLE, MAX_TCP_KEEPINTVL and MAX_TCP_KEEPCNT.
    for (k, v, max) in [
        ("keepalive_idle_s", t.keepalive_idle_s, 32767),
        ("keepalive_interval_s", t.keepalive_interval_s, 32767),
        ("keepalive_count", t.keepalive_count, 127),
    ] {
        if let Some(v) = v {
            in_range(src, &key(k), u64::from(v), 1, max)?;
        }
    }
    if idle.is_none() {
        for (k, v) in [
            ("keepalive_interval_s", t.keepalive_interval_s),
            ("keepalive_count", t.keepalive_count),
        ] {
            if v.is_some() {
                return Err(src.invalid(
                    &key(k),
                    "has no effect without keepalive_idle_s, which turns keepalive on; set that too",
                ));
            }
        }
    }
    Ok(())
}

/// Linux interface name rules (`dev_valid_name`): 1..=15 bytes, not `.` or `..`, no
/// `/`, `:` or whitespace.
/// A unicast MAC address `xx:xx:xx:xx:xx:xx`.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let bad = || format!("{s:?} is not a MAC address (six hex bytes: 02:00:5e:00:01:01)");
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        let p = parts.next().ok_or_else(bad)?;
        if p.len() != 2 {
            return Err(bad());
        }
        *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    if mac[0] & 1 == 1 {
        return Err(format!(
            "{s} is a group (multicast) address: use a unicast one"
        ));
    }
    if mac == [0; 6] {
        return Err("00:00:00:00:00:00 is not a usable MAC address".into());
    }
    Ok(mac)
}

fn check_ifname(src: &Source<'_>, path: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty()
        || name.len() > 15
        || name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(src.invalid(
            path,
            format!(
                "{name:?} is not a valid interface name (1..=15 bytes, no '/', ':' or whitespace)"
            ),
        ));
    }
    Ok(())
}
