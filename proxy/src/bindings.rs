//! How many MH addresses one station may have bound here at once (network detection).
//!
//! With network detection an address no MSR serves becomes the first station's that
//! sends from it, bound to its link-layer address and answered for on the fixed LAN.
//! A station may send from every unused address of the MH prefixes; binding each
//! would draw their fixed-side traffic here. So a station keeps at most
//! `[access] max_addresses_per_station`: past it, its addresses with no connection
//! here go, the longest bound first. An address carrying connections is in use and
//! stays (a squatter that opens connections on each address meets the per-station
//! handshake and connection limits instead). Pure logic.

use std::net::IpAddr;

/// One address bound to the station.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub addr: IpAddr,
    /// Order of binding: higher is newer.
    pub seq: u64,
    /// Connections of this address are served here.
    pub busy: bool,
}

/// The addresses of one station to let go so that at most `cap` stay bound: the
/// oldest idle ones. Busy addresses count towards `cap` but are never let go.
pub fn over_cap(mut bound: Vec<Bound>, cap: usize) -> Vec<IpAddr> {
    let excess = bound.len().saturating_sub(cap);
    bound.retain(|b| !b.busy);
    bound.sort_by_key(|b| b.seq);
    bound.into_iter().take(excess).map(|b| b.addr).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(last: u8, seq: u64, busy: bool) -> Bound {
        Bound {
            addr: IpAddr::from([10, 2, 0, last]),
            seq,
            busy,
        }
    }

    #[test]
    fn within_the_cap_nothing_goes() {
        assert!(over_cap(vec![], 1).is_empty());
        assert!(over_cap(vec![b(1, 1, false), b(2, 2, false)], 2).is_empty());
    }

    #[test]
    fn past_the_cap_the_oldest_idle_addresses_go() {
        let bound = vec![b(3, 30, false), b(1, 10, false), b(2, 20, false)];
        assert_eq!(
            over_cap(bound, 1),
            vec![IpAddr::from([10, 2, 0, 1]), IpAddr::from([10, 2, 0, 2])]
        );
    }

    #[test]
    fn busy_addresses_count_but_stay() {
        // Oldest is busy: the next oldest idle one goes in its place.
        let bound = vec![b(1, 1, true), b(2, 2, false), b(3, 3, false)];
        assert_eq!(over_cap(bound, 2), vec![IpAddr::from([10, 2, 0, 2])]);
        // All busy: none goes, even past the cap.
        assert!(over_cap(vec![b(1, 1, true), b(2, 2, true)], 1).is_empty());
    }
}
