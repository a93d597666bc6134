//! Structured logs with `tracing`: human text or JSON lines, level from the config
//! (overridable with `MSRD_LOG=debug`), to stderr (journald picks it up under systemd).

use itcp_config::MsrdConfig;
use tracing::Level;

pub fn init(cfg: &MsrdConfig) {
    let level_name = std::env::var("MSRD_LOG").unwrap_or_else(|_| cfg.msr.log_level.to_string());
    let level = match level_name.to_ascii_lowercase().as_str() {
        "error" => Level::ERROR,
        "warn" => Level::WARN,
        "debug" => Level::DEBUG,
        "trace" => Level::TRACE,
        _ => Level::INFO,
    };
    let b = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false);
    if cfg.msr.log_format.to_string() == "json" {
        b.json().init();
    } else {
        b.init();
    }
}
