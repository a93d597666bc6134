//! `msrd`: the I-TCP mobility support router daemon.
//!
//! ```text
//! msrd --config /etc/msrd/msrd.toml
//! msrd --check-config /etc/msrd/msrd.toml
//! ```

use std::process::ExitCode;

use itcp_config::MsrdConfig;

const USAGE: &str = "usage: msrd --config FILE | --check-config FILE";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (check, path) = match args.as_slice() {
        [f, p] if f == "--config" => (false, p.clone()),
        [f, p] if f == "--check-config" => (true, p.clone()),
        [h] if h == "-h" || h == "--help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("msrd: {USAGE}");
            return ExitCode::from(2);
        }
    };
    let cfg = match MsrdConfig::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("msrd: {e}");
            return ExitCode::FAILURE;
        }
    };
    if check {
        println!("{path}: ok");
        return ExitCode::SUCCESS;
    }
    itcp_proxy::logging::init(&cfg);
    match itcp_proxy::daemon::run(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("msrd: {e}");
            ExitCode::FAILURE
        }
    }
}
