//! Structured logs with `tracing`: human text or JSON lines, level from the config
//! (overridable with `MSRD_LOG=debug`), to stderr (journald picks it up under systemd).

use itcp_config::MsrdConfig;
use tracing::Level;

/// The level named by `MSRD_LOG` (if set) or the config; an unknown name is an error
/// that says what is accepted (a typo must not silently log at another level).
pub fn level(cfg: &MsrdConfig, env: Option<&str>) -> Result<Level, String> {
    let (name, from) = match env {
        Some(v) => (v.to_string(), "MSRD_LOG"),
        None => (cfg.msr.log_level.to_string(), "msr.log_level"),
    };
    match name.trim().to_ascii_lowercase().as_str() {
        "error" => Ok(Level::ERROR),
        "warn" => Ok(Level::WARN),
        "info" => Ok(Level::INFO),
        "debug" => Ok(Level::DEBUG),
        "trace" => Ok(Level::TRACE),
        _ => Err(format!(
            "{from}={name:?} is not a log level (error, warn, info, debug, trace)"
        )),
    }
}

pub fn init(cfg: &MsrdConfig) -> Result<(), String> {
    let level = level(cfg, std::env::var("MSRD_LOG").ok().as_deref())?;
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_level_is_an_error_naming_its_source() {
        let cfg = MsrdConfig::from_str(
            "[msr]\nid = \"m\"\ngateway = [\"10.2.0.1\"]\n[access]\nmh_prefixes = [\"10.2.0.0/24\"]\n",
            "test",
        )
        .unwrap();
        assert_eq!(level(&cfg, Some("DEBUG")), Ok(Level::DEBUG));
        let e = level(&cfg, Some("verbose")).unwrap_err();
        assert!(e.contains("MSRD_LOG") && e.contains("verbose"), "{e}");
        assert_eq!(level(&cfg, None), Ok(Level::INFO));
    }
}
