//! msrd's test hooks (`MSRD_FAULT`, `MSRD_FAULT_DELAY_MS`; docs/testing.md): faults
//! and delays the end-to-end tests inject at chosen points. Never set on a router.

/// Whether the test hook `name` is among the comma-separated `MSRD_FAULT` ones
/// (`slow_restore`, `slow_ack`: delays that combine).
/// Read once: some are checked on the relay's path (each relay's end).
pub fn fault(name: &str) -> bool {
    static HOOKS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    HOOKS
        .get_or_init(|| {
            std::env::var("MSRD_FAULT")
                .map(|v| v.split(',').map(str::to_string).collect())
                .unwrap_or_default()
        })
        .iter()
        .any(|f| f == name)
}

/// How long an injected restart failure or a slow restore takes
/// (`MSRD_FAULT_DELAY_MS`), read once.
pub fn fault_delay() -> Option<std::time::Duration> {
    static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        let ms = std::env::var("MSRD_FAULT_DELAY_MS").ok()?.parse().ok()?;
        Some(std::time::Duration::from_millis(ms))
    })
}
