//! `itcp-handoff`: socket images (TCP_REPAIR capture/restore), the MSR⇄MSR handoff
//! protocol, flow holds and handoff log records.
//!
//! Not built yet: issue 4 fills this crate. It deliberately exports nothing until then.
